// Synthetic checkpoints with the exact published shapes of real Qwen models (spec §2.2, §3.2) and
// random weights, for benchmarking: speed does not depend on the weight values, and real weights
// cannot be downloaded where qhx is built.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "util/json_file.h"

namespace qhx {

// The shape of a model: what its config.json says. Qwen3.5 ("hybrid") layers follow the released
// pattern, full attention in every 4th layer, Gated DeltaNet in the others.
struct SynthShape {
  std::string name;
  bool hybrid = false;  // Qwen3.5 (Gated DeltaNet + gated attention), else Qwen3 dense
  int64_t vocab = 0, hidden = 0, intermediate = 0, layers = 0, heads = 0, kv_heads = 0,
          head_dim = 0;
  int64_t linear_key_heads = 0, linear_value_heads = 0, linear_head_dim = 0;  // hybrid only
  int64_t max_context = 0;
};

std::vector<std::string> synth_preset_names();            // "qwen3-0.6b", ..., "qwen3.5-4b"
const SynthShape& synth_preset(const std::string& name);  // throws Error naming the presets

// A Qwen3.5 vision tower's shape (vision_config). Every Qwen3.5 preset gets the Qwen3-VL-2B
// tower (depth 24, hidden 1024, 16 heads, MLP 4096, 48x48 learned positions), its output in the
// text model's hidden size: assumed, as the released Qwen3.5 configs could not be read here.
struct SynthVision {
  int64_t depth = 24, hidden = 1024, heads = 16, intermediate = 4096, positions = 2304;
};

// The config.json of a synthetic checkpoint (Hugging Face's keys and layout); with a tower,
// Qwen3_5ForConditionalGeneration's (text_config, vision_config, the vision token ids).
Json synthetic_config_json(const SynthShape& shape, const SynthVision* vision = nullptr);

// Writes a Hugging Face-layout checkpoint (config.json, generation_config.json, one bf16
// model.safetensors; the Qwen3.5 GDN A_log and gated-norm weights f32 as released) into `out`,
// which must not exist. Weights are uniform random with the spread of a trained model's
// (std 0.02 for matrices); norms are identity. No tokenizer: drive it with token ids. With
// `vision` (Qwen3.5 only), the multimodal layout: model.language_model.*, model.visual.* and
// the released preprocessor_config.json.
void write_synthetic_checkpoint(const SynthShape& shape, const std::filesystem::path& out,
                                uint64_t seed, const SynthVision* vision = nullptr);

}  // namespace qhx
