// Hugging Face config.json → the plain structs the runtime uses (generation_config.json:
// runtime/generation_config.h).
#pragma once

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace qhx {

enum class Family { kQwen3, kQwen3_5 };

// Token mixer of a decoder layer: softmax attention with a KV cache, or Gated DeltaNet linear
// attention with a conv state and a recurrent state (Qwen3.5, spec §3.7).
enum class LayerKind { kFullAttention, kLinearAttention };

// Text-decoder hyper-parameters (spec §2.1, §3.1). Keys that change the math and that qhx does not
// implement (biases, sliding windows, RoPE scaling) are rejected, not ignored.
// Qwen3.5's vision tower (vision_config of a multimodal checkpoint): a ViT over patches of
// temporal_patch × patch × patch pixels with learned position embeddings interpolated to the
// image's grid and 2-D RoPE, whose merger folds merge × merge patches into one token of
// out_hidden_size (the text model's hidden size).
struct VisionConfig {
  int64_t depth = 0, hidden_size = 0, intermediate_size = 0, num_heads = 0;
  int64_t in_channels = 3, patch_size = 16, temporal_patch_size = 2, spatial_merge_size = 2;
  int64_t out_hidden_size = 0, num_position_embeddings = 0;
  bool gelu_tanh = true;  // hidden_act gelu_pytorch_tanh (else exact gelu)
  double rope_theta = 10000.0;
  int64_t head_dim() const { return hidden_size / num_heads; }
  int64_t patch_values() const {
    return in_channels * temporal_patch_size * patch_size * patch_size;
  }
};

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
  int64_t rotary_dim = 0;  // leading dims of each head that RoPE rotates (partial rotary)
  std::vector<LayerKind> layer_types;
  // Gated DeltaNet layers (Qwen3.5 only).
  int64_t linear_num_key_heads = 0;
  int64_t linear_num_value_heads = 0;  // a multiple of the key heads
  int64_t linear_key_head_dim = 0;
  int64_t linear_value_head_dim = 0;
  int64_t linear_conv_kernel_dim = 0;
  // Run-plan setting, not a checkpoint key: tokens per chunk of the chunked delta rule in
  // prefill (a bundle's plan.generate.prefill_chunk; transformers uses 64).
  int64_t deltanet_chunk = 64;
  // Run-plan setting: W8/W4 matrices multiply int8-quantized activations (a bundle's
  // precision_policy.activations is "int8"; see core/tensor.h).
  bool int8_activations = false;
  bool tie_word_embeddings = false;  // a hint only: tying is decided by the weights present
  int64_t max_position_embeddings = 32768;
  std::optional<int32_t> bos_token_id;
  std::vector<int32_t> eos_token_ids;
  // M-RoPE (Qwen3.5): rotary frequency i turns by the height position when i % 3 == 1 and
  // i < 3·mrope_section[1], by the width position when i % 3 == 2 and i < 3·mrope_section[2],
  // else by the temporal one (transformers interleaves them so); text has all three equal.
  std::vector<int64_t> mrope_section;
  // A multimodal checkpoint's vision tower and its tokens; `vision_unavailable` says why a
  // vision_config is there but not one qhx reads (the model then reads text only).
  std::optional<VisionConfig> vision;
  std::string vision_unavailable;
  int32_t image_token_id = -1, video_token_id = -1;
  int32_t vision_start_token_id = -1, vision_end_token_id = -1;
};

// Reads config.json; a nested "text_config" (multimodal wrappers) takes precedence.
ModelConfig load_model_config(const std::filesystem::path& config_json);
// The same from an already parsed config object; `where` names it in errors.
ModelConfig parse_model_config(const nlohmann::json& root, const std::string& where);

// An eos_token_id-style value: an id, a list of ids, or null (none); `where` names it in errors.
std::vector<int32_t> parse_token_ids(const nlohmann::json& value, const std::string& where);

}  // namespace qhx
