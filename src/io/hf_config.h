// Hugging Face config.json / generation_config.json → the plain structs the runtime uses.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace qhx {

enum class Family { kQwen3 };

// Text-decoder hyper-parameters (spec §2.1). Keys that change the math and that qhx does not
// implement (biases, sliding windows, RoPE scaling) are rejected, not ignored.
struct ModelConfig {
  Family family = Family::kQwen3;
  std::string model_type;
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_layers = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;  // default: num_heads
  int64_t head_dim = 0;      // default: hidden_size / num_heads
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  bool tie_word_embeddings = false;  // a hint only: tying is decided by the weights present
  int64_t max_position_embeddings = 32768;
  std::optional<int32_t> bos_token_id;
  std::vector<int32_t> eos_token_ids;
};

// Reads config.json; a nested "text_config" (multimodal wrappers) takes precedence.
ModelConfig load_model_config(const std::filesystem::path& config_json);

// Sampling defaults and stop ids from generation_config.json (all optional).
struct GenerationDefaults {
  std::optional<bool> do_sample;
  std::optional<double> temperature;
  std::optional<int64_t> top_k;
  std::optional<double> top_p;
  std::vector<int32_t> eos_token_ids;
};
GenerationDefaults load_generation_defaults(const std::filesystem::path& generation_config_json);

}  // namespace qhx
