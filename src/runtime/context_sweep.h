// How a model's greedy replies hold up as the context grows: at each depth, the first `depth`
// tokens of a text are read and the reply followed greedily, beside a reference's (the f32 model,
// or the same model on the CPU alone) — where the reply first departs from the reference's, and
// whether it stays coherent: a reply that ends at once where the reference's goes on, or that the
// reference finds much less likely than its own, is not (the 0.6B NPU card's "coherent to 512,
// empty at ~717 of 1024"). qhx bench --context-sweep prints it.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "models/model.h"

namespace qhx {

struct SweepPoint {
  int64_t depth = 0;             // tokens of the text read before the reply
  int64_t first_departure = -1;  // the reply's first token unlike the reference's; -1: none
  int64_t length = 0, reference_length = 0;  // tokens before an end-of-sequence token
  // Mean negative log-likelihood per token, under the reference, of the reply and of the
  // reference's own reply (nats; 0 for an empty reply).
  double nll = 0, reference_nll = 0;
  bool coherent = false;
};

// A reply is coherent when it is not empty unless the reference's is, and its mean NLL under
// the reference is within this many nats of the reference's own.
inline constexpr double kCoherentNllMargin = 1.0;

// The sweep over `depths` (each at most text.size(), and depth + tokens within both models'
// contexts), replies of at most `tokens` tokens ending at the model's end-of-sequence ids.
std::vector<SweepPoint> context_sweep(const Model& model, const Model& reference,
                                      std::span<const int32_t> text,
                                      std::span<const int64_t> depths, int64_t tokens);

// The default depths for a model of `max_context` positions and a text of `text_tokens`: powers
// of two from 128 while a reply of `tokens` still fits, then the deepest that fits (empty when
// none does).
std::vector<int64_t> default_sweep_depths(int64_t max_context, int64_t text_tokens, int64_t tokens);

}  // namespace qhx
