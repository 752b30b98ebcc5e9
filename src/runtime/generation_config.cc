#include "runtime/generation_config.h"

#include <algorithm>
#include <set>
#include <string_view>

#include "util/error.h"

namespace qhx {
namespace {

// Fields that change nothing qhx generates: ids it does not use, run-time and output options,
// length limits the caller sets (-n), and settings only beam search reads.
const std::set<std::string_view> kIgnored = {"bos_token_id",
                                             "pad_token_id",
                                             "decoder_start_token_id",
                                             "transformers_version",
                                             "_from_model_config",
                                             "max_length",
                                             "use_cache",
                                             "cache_implementation",
                                             "cache_config",
                                             "return_legacy_cache",
                                             "output_attentions",
                                             "output_hidden_states",
                                             "output_scores",
                                             "output_logits",
                                             "return_dict_in_generate",
                                             "renormalize_logits",
                                             "remove_invalid_values",
                                             "length_penalty",
                                             "early_stopping",
                                             "diversity_penalty",
                                             "num_assistant_tokens",
                                             "num_assistant_tokens_schedule",
                                             "assistant_confidence_threshold",
                                             "prompt_lookup_num_tokens",
                                             "max_matching_ngram_size",
                                             "assistant_early_exit",
                                             "assistant_lookbehind",
                                             "target_lookbehind",
                                             "is_assistant",
                                             "compile_config",
                                             "disable_compile",
                                             "generation_kwargs",
                                             "trust_remote_code"};

// Fields that would change the output, with the value under which they do not.
struct Neutral {
  std::string_view key;
  Json value;  // null: only null (or absent) is neutral
};
const Neutral kUnsupported[] = {{"num_beams", 1},
                                {"num_beam_groups", 1},
                                {"num_return_sequences", 1},
                                {"typical_p", 1.0},
                                {"epsilon_cutoff", 0.0},
                                {"eta_cutoff", 0.0},
                                {"no_repeat_ngram_size", 0},
                                {"encoder_no_repeat_ngram_size", 0},
                                {"encoder_repetition_penalty", 1.0},
                                {"min_length", 0},
                                {"min_new_tokens", 0},
                                {"guidance_scale", 1.0},
                                {"token_healing", false},
                                {"penalty_alpha", nullptr},
                                {"top_h", nullptr},
                                {"bad_words_ids", nullptr},
                                {"sequence_bias", nullptr},
                                {"suppress_tokens", nullptr},
                                {"begin_suppress_tokens", nullptr},
                                {"forced_bos_token_id", nullptr},
                                {"forced_eos_token_id", nullptr},
                                {"exponential_decay_length_penalty", nullptr},
                                {"watermarking_config", nullptr},
                                {"constraints", nullptr},
                                {"force_words_ids", nullptr},
                                {"stop_strings", nullptr},
                                {"max_time", nullptr},
                                {"dola_layers", nullptr}};

// A number field, or nullopt when absent or null (transformers' "unset").
std::optional<double> number(const Json& cfg, std::string_view key, const std::string& where) {
  const auto it = cfg.find(key);
  if (it == cfg.end() || it->is_null()) return std::nullopt;
  return require_number(cfg, key, where);
}

std::optional<int64_t> integer(const Json& cfg, std::string_view key, const std::string& where) {
  const auto it = cfg.find(key);
  if (it == cfg.end() || it->is_null()) return std::nullopt;
  return require_int(cfg, key, where);
}

}  // namespace

GenerationDefaults parse_generation_config(const Json& cfg, const std::string& where,
                                           const ModelConfig& config) {
  if (!cfg.is_object()) fail(where, "expected a JSON object");
  const std::set<std::string_view> read = {"do_sample",    "temperature",   "top_k",
                                           "top_p",        "min_p",         "repetition_penalty",
                                           "eos_token_id", "max_new_tokens"};
  for (const auto& item : cfg.items()) {
    const std::string& key = item.key();
    const Json& value = item.value();
    if (read.contains(key) || kIgnored.contains(key)) continue;
    const auto unsupported = std::find_if(std::begin(kUnsupported), std::end(kUnsupported),
                                          [&](const Neutral& n) { return n.key == key; });
    if (unsupported == std::end(kUnsupported)) {
      fail(field(where, key), "unknown key (qhx cannot tell whether it changes the output)");
    }
    const bool neutral = value.is_null() || (value.is_array() && value.empty()) ||
                         (value.is_number() && unsupported->value.is_number()
                              ? value.get<double>() == unsupported->value.get<double>()
                              : value == unsupported->value);
    if (!neutral) fail(field(where, key), "value " + value.dump() + " is not supported by qhx");
  }

  GenerationDefaults d;
  SamplingParams& s = d.sampling;
  if (const auto it = cfg.find("do_sample"); it != cfg.end() && !it->is_null()) {
    if (!it->is_boolean()) fail(field(where, "do_sample"), "expected true or false");
    s.greedy = !it->get<bool>();
  }
  s.temperature = static_cast<float>(number(cfg, "temperature", where).value_or(1.0));
  // transformers keeps min(top_k, vocabulary) tokens: a larger top_k keeps them all.
  s.top_k = std::min<int64_t>(integer(cfg, "top_k", where).value_or(50), config.vocab_size);
  s.top_p = static_cast<float>(number(cfg, "top_p", where).value_or(1.0));
  s.min_p = static_cast<float>(number(cfg, "min_p", where).value_or(0.0));
  s.repetition_penalty = static_cast<float>(number(cfg, "repetition_penalty", where).value_or(1.0));
  try {
    Sampler check(s);
  } catch (const Error& e) {
    fail(where, e.what());
  }
  d.max_new_tokens = integer(cfg, "max_new_tokens", where);
  if (d.max_new_tokens && *d.max_new_tokens < 0) {
    fail(field(where, "max_new_tokens"), "must be >= 0");
  }
  const auto eos = cfg.find("eos_token_id");
  d.eos_ids = eos != cfg.end() && !eos->is_null()
                  ? parse_token_ids(*eos, field(where, "eos_token_id"))
                  : config.eos_token_ids;
  return d;
}

GenerationDefaults load_generation_config(const std::filesystem::path& model_dir,
                                          const ModelConfig& config) {
  const std::filesystem::path path = model_dir / "generation_config.json";
  if (!std::filesystem::exists(path)) {
    // What transformers' generate() does without the file: greedy, its default top_k of 50
    // (used once a caller asks for sampling), and the model config's eos.
    GenerationDefaults d;
    d.sampling.top_k = 50;
    d.eos_ids = config.eos_token_ids;
    return d;
  }
  return parse_generation_config(read_json_file(path), path.string(), config);
}

std::vector<int32_t> default_stop_ids(const GenerationDefaults& defaults,
                                      std::span<const int32_t> bundle_stop_ids,
                                      std::optional<int32_t> tokenizer_eos) {
  std::vector<int32_t> ids(defaults.eos_ids.begin(), defaults.eos_ids.end());
  ids.insert(ids.end(), bundle_stop_ids.begin(), bundle_stop_ids.end());
  if (tokenizer_eos) ids.push_back(*tokenizer_eos);
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

}  // namespace qhx
