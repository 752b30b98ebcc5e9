// A checkpoint's generation_config.json → what `generate` does by default, as transformers'
// generate() would with that checkpoint (its global defaults fill what the file leaves unset).
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "io/hf_config.h"
#include "runtime/sampler.h"
#include "util/json_file.h"

namespace qhx {

struct GenerationDefaults {
  SamplingParams sampling;  // greedy unless do_sample; top_k 50 when unset (transformers' default)
  std::vector<int32_t> eos_ids;
  std::optional<int64_t> max_new_tokens;
};

// Reads <model_dir>/generation_config.json when present (a bundle carries its checkpoint's copy).
// eos_ids: the file's eos_token_id, or config.json's (config.eos_token_ids) when the file or the
// field is absent. The tokenizer's eos is not known here: a caller with a tokenizer adds it.
// Known transformers fields that do not change the output (bos/pad ids, max_length, cache and
// output options, beam-only settings) are ignored; ones that would and that qhx cannot honour
// (num_beams > 1, typical_p, bad_words_ids, ...) and unknown keys throw Error naming the field.
GenerationDefaults load_generation_config(const std::filesystem::path& model_dir,
                                          const ModelConfig& config);
// Every id generation stops on by default, sorted and without repeats: the defaults' eos ids, the
// stop ids a bundle's manifest records (bundles made before they kept generation_config.json),
// and the tokenizer's eos.
std::vector<int32_t> default_stop_ids(const GenerationDefaults& defaults,
                                      std::span<const int32_t> bundle_stop_ids,
                                      std::optional<int32_t> tokenizer_eos);
// The same from a parsed generation_config object; `where` names it in errors.
GenerationDefaults parse_generation_config(const Json& cfg, const std::string& where,
                                           const ModelConfig& config);

}  // namespace qhx
