// The generate loop: prefill the prompt, then decode one token at a time until n tokens or a
// stop id, reporting each token as it is chosen.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "models/model.h"
#include "runtime/sampler.h"

namespace qhx {

struct GenerateOptions {
  int64_t max_new_tokens = 64;
  SamplingParams sampling;
  std::vector<int32_t> stop_ids;
};

struct GenerateStats {
  int64_t n_prompt = 0;
  int64_t n_generated = 0;
  double prefill_seconds = 0;  // the prompt's forward pass
  double ttft_seconds = 0;     // prompt in → first token chosen
  double decode_seconds = 0;   // all later tokens
  bool stopped_at_stop_id = false;
  bool stopped_by_caller = false;  // on_token returned false
};

// Calls on_token(id) for every generated token (a stop id included, then generation ends);
// on_token returns false to end generation after that token (the CLI's stop strings).
// The sampler's repetition penalty sees `prompt` and the generated tokens, not tokens that were
// already in `state`.
GenerateStats generate(const Model& model, ModelState& state, std::span<const int32_t> prompt,
                       const GenerateOptions& options,
                       const std::function<bool(int32_t)>& on_token);

}  // namespace qhx
