#include "forge/synth.h"

#include <cmath>
#include <cstring>
#include <fstream>
#include <random>

#include "core/dtype.h"
#include "io/safetensors.h"
#include "kernels/quant.h"
#include "util/error.h"
#include "util/json_file.h"

namespace qhx {
namespace {

namespace fs = std::filesystem;

// Spec §2.2 and §3.2.
const SynthShape kPresets[] = {
    {"qwen3-0.6b", false, 151936, 1024, 3072, 28, 16, 8, 128, 0, 0, 0, 40960},
    {"qwen3-1.7b", false, 151936, 2048, 6144, 28, 16, 8, 128, 0, 0, 0, 40960},
    {"qwen3.5-0.8b", true, 248320, 1024, 3584, 24, 8, 2, 256, 16, 16, 128, 262144},
    {"qwen3.5-2b", true, 248320, 2048, 6144, 24, 8, 2, 256, 16, 16, 128, 262144},
    {"qwen3.5-4b", true, 248320, 2560, 9216, 32, 16, 4, 256, 16, 32, 128, 262144},
};

bool is_full_attention(const SynthShape& p, int64_t layer) {
  return !p.hybrid || (layer + 1) % 4 == 0;
}

}  // namespace

Json synthetic_config_json(const SynthShape& p, const SynthVision* vision) {
  if (vision != nullptr) {
    if (!p.hybrid) fail("--vision", p.name + " is a text model: only Qwen3.5 reads images");
    Json text = synthetic_config_json(p);
    // The released ids; a shape whose vocabulary is smaller (tests) takes its last five.
    const int64_t base = p.vocab > 248057 ? 248053 : p.vocab - 5;
    text["model_type"] = "qwen3_5_text";
    text.erase("architectures");
    return {{"architectures", {"Qwen3_5ForConditionalGeneration"}},
            {"model_type", "qwen3_5"},
            {"tie_word_embeddings", true},
            {"image_token_id", base + 3},
            {"video_token_id", base + 4},
            {"vision_start_token_id", base},
            {"vision_end_token_id", base + 1},
            {"text_config", text},
            {"vision_config",
             {{"model_type", "qwen3_5_vision"},
              {"depth", vision->depth},
              {"hidden_size", vision->hidden},
              {"hidden_act", "gelu_pytorch_tanh"},
              {"intermediate_size", vision->intermediate},
              {"num_heads", vision->heads},
              {"in_channels", 3},
              {"patch_size", 16},
              {"spatial_merge_size", 2},
              {"temporal_patch_size", 2},
              {"out_hidden_size", p.hidden},
              {"num_position_embeddings", vision->positions},
              {"deepstack_visual_indexes", Json::array()}}}};
  }
  Json c = {{"attention_bias", false},
            {"attention_dropout", 0.0},
            {"dtype", "bfloat16"},
            {"head_dim", p.head_dim},
            {"hidden_act", "silu"},
            {"hidden_size", p.hidden},
            {"initializer_range", 0.02},
            {"intermediate_size", p.intermediate},
            {"max_position_embeddings", p.max_context},
            {"num_attention_heads", p.heads},
            {"num_hidden_layers", p.layers},
            {"num_key_value_heads", p.kv_heads},
            {"rms_norm_eps", 1e-6},
            {"tie_word_embeddings", true},
            {"use_cache", true},
            {"vocab_size", p.vocab}};
  Json layer_types = Json::array();
  for (int64_t i = 0; i < p.layers; ++i) {
    layer_types.push_back(is_full_attention(p, i) ? "full_attention" : "linear_attention");
  }
  c["layer_types"] = layer_types;
  if (p.hybrid) {
    c["architectures"] = {"Qwen3_5ForCausalLM"};
    c["model_type"] = "qwen3_5_text";
    c["bos_token_id"] = nullptr;
    c["eos_token_id"] = 248044;
    c["linear_conv_kernel_dim"] = 4;
    c["linear_key_head_dim"] = p.linear_head_dim;
    c["linear_value_head_dim"] = p.linear_head_dim;
    c["linear_num_key_heads"] = p.linear_key_heads;
    c["linear_num_value_heads"] = p.linear_value_heads;
    c["rope_parameters"] = {{"rope_type", "default"},
                            {"rope_theta", 1e7},
                            {"partial_rotary_factor", 0.25},
                            {"mrope_section", {11, 11, 10}},
                            {"mrope_interleaved", true}};
  } else {
    c["architectures"] = {"Qwen3ForCausalLM"};
    c["model_type"] = "qwen3";
    c["bos_token_id"] = 151643;
    c["eos_token_id"] = 151645;
    c["max_window_layers"] = p.layers;
    c["sliding_window"] = nullptr;
    c["use_sliding_window"] = false;
    c["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1e6}};
  }
  return c;
}

namespace {

enum class Fill { kMatrix, kOnes, kZeros, kALog, kDtBias, kConv };

struct SynthTensor {
  SafetensorsEntry entry;
  Fill fill;
};

std::vector<SynthTensor> tensor_list(const SynthShape& p, const SynthVision* vision) {
  std::vector<SynthTensor> out;
  // The text model's tensors under model.language_model. in the multimodal layout.
  const std::string text_prefix = vision != nullptr ? "model.language_model." : "model.";
  const auto add = [&](std::string name, DType dtype, std::vector<int64_t> shape, Fill fill) {
    if (name.starts_with("model.") && !name.starts_with("model.visual.")) {
      name = text_prefix + name.substr(6);
    }
    out.push_back({{std::move(name), dtype, std::move(shape)}, fill});
  };
  if (vision != nullptr) {  // Qwen3.5's tower: LayerNorms and biases identity and zero
    const int64_t H = vision->hidden, I = vision->intermediate, merged = 4 * H;
    const std::string v = "model.visual.";
    add(v + "patch_embed.proj.weight", DType::kBF16, {H, 3, 2, 16, 16}, Fill::kMatrix);
    add(v + "patch_embed.proj.bias", DType::kBF16, {H}, Fill::kZeros);
    add(v + "pos_embed.weight", DType::kBF16, {vision->positions, H}, Fill::kMatrix);
    for (int64_t i = 0; i < vision->depth; ++i) {
      const std::string b = v + "blocks." + std::to_string(i) + ".";
      for (const char* norm : {"norm1", "norm2"}) {
        add(b + norm + ".weight", DType::kBF16, {H}, Fill::kOnes);
        add(b + norm + ".bias", DType::kBF16, {H}, Fill::kZeros);
      }
      add(b + "attn.qkv.weight", DType::kBF16, {3 * H, H}, Fill::kMatrix);
      add(b + "attn.qkv.bias", DType::kBF16, {3 * H}, Fill::kZeros);
      add(b + "attn.proj.weight", DType::kBF16, {H, H}, Fill::kMatrix);
      add(b + "attn.proj.bias", DType::kBF16, {H}, Fill::kZeros);
      add(b + "mlp.linear_fc1.weight", DType::kBF16, {I, H}, Fill::kMatrix);
      add(b + "mlp.linear_fc1.bias", DType::kBF16, {I}, Fill::kZeros);
      add(b + "mlp.linear_fc2.weight", DType::kBF16, {H, I}, Fill::kMatrix);
      add(b + "mlp.linear_fc2.bias", DType::kBF16, {H}, Fill::kZeros);
    }
    add(v + "merger.norm.weight", DType::kBF16, {H}, Fill::kOnes);
    add(v + "merger.norm.bias", DType::kBF16, {H}, Fill::kZeros);
    add(v + "merger.linear_fc1.weight", DType::kBF16, {merged, merged}, Fill::kMatrix);
    add(v + "merger.linear_fc1.bias", DType::kBF16, {merged}, Fill::kZeros);
    add(v + "merger.linear_fc2.weight", DType::kBF16, {p.hidden, merged}, Fill::kMatrix);
    add(v + "merger.linear_fc2.bias", DType::kBF16, {p.hidden}, Fill::kZeros);
  }
  // Qwen3.5 norms are zero-centred (weight 0 = identity), Qwen3's plain (weight 1 = identity).
  const Fill identity_norm = p.hybrid ? Fill::kZeros : Fill::kOnes;
  const int64_t H = p.hidden;
  add("model.embed_tokens.weight", DType::kBF16, {p.vocab, H}, Fill::kMatrix);
  for (int64_t i = 0; i < p.layers; ++i) {
    const std::string l = "model.layers." + std::to_string(i) + ".";
    add(l + "input_layernorm.weight", DType::kBF16, {H}, identity_norm);
    add(l + "post_attention_layernorm.weight", DType::kBF16, {H}, identity_norm);
    if (is_full_attention(p, i)) {
      const int64_t q_rows = p.heads * p.head_dim * (p.hybrid ? 2 : 1);  // + output gate
      add(l + "self_attn.q_proj.weight", DType::kBF16, {q_rows, H}, Fill::kMatrix);
      add(l + "self_attn.k_proj.weight", DType::kBF16, {p.kv_heads * p.head_dim, H}, Fill::kMatrix);
      add(l + "self_attn.v_proj.weight", DType::kBF16, {p.kv_heads * p.head_dim, H}, Fill::kMatrix);
      add(l + "self_attn.o_proj.weight", DType::kBF16, {H, p.heads * p.head_dim}, Fill::kMatrix);
      add(l + "self_attn.q_norm.weight", DType::kBF16, {p.head_dim}, identity_norm);
      add(l + "self_attn.k_norm.weight", DType::kBF16, {p.head_dim}, identity_norm);
    } else {
      const int64_t key_dim = p.linear_key_heads * p.linear_head_dim;
      const int64_t value_dim = p.linear_value_heads * p.linear_head_dim;
      const int64_t conv_channels = 2 * key_dim + value_dim;
      const std::string a = l + "linear_attn.";
      add(a + "in_proj_qkv.weight", DType::kBF16, {conv_channels, H}, Fill::kMatrix);
      add(a + "in_proj_z.weight", DType::kBF16, {value_dim, H}, Fill::kMatrix);
      add(a + "in_proj_b.weight", DType::kBF16, {p.linear_value_heads, H}, Fill::kMatrix);
      add(a + "in_proj_a.weight", DType::kBF16, {p.linear_value_heads, H}, Fill::kMatrix);
      add(a + "conv1d.weight", DType::kBF16, {conv_channels, 1, 4}, Fill::kConv);
      add(a + "A_log", DType::kF32, {p.linear_value_heads}, Fill::kALog);
      add(a + "dt_bias", DType::kBF16, {p.linear_value_heads}, Fill::kDtBias);
      add(a + "norm.weight", DType::kF32, {p.linear_head_dim}, Fill::kOnes);
      add(a + "out_proj.weight", DType::kBF16, {H, value_dim}, Fill::kMatrix);
    }
    add(l + "mlp.gate_proj.weight", DType::kBF16, {p.intermediate, H}, Fill::kMatrix);
    add(l + "mlp.up_proj.weight", DType::kBF16, {p.intermediate, H}, Fill::kMatrix);
    add(l + "mlp.down_proj.weight", DType::kBF16, {H, p.intermediate}, Fill::kMatrix);
  }
  add("model.norm.weight", DType::kBF16, {H}, identity_norm);
  return out;
}

// xorshift64*: fast enough to fill billions of weights in seconds.
struct FastRandom {
  uint64_t state;
  float uniform() {  // [-1, 1)
    state ^= state >> 12;
    state ^= state << 25;
    state ^= state >> 27;
    const uint64_t bits = state * 0x2545F4914F6CDD1DULL;
    return static_cast<float>(bits >> 40) * (2.0f / 16777216.0f) - 1.0f;
  }
};

void fill_tensor(const SynthTensor& t, uint64_t seed, std::span<std::byte> out) {
  FastRandom rng{seed * 0x9E3779B97F4A7C15ULL + 1};
  const size_t n = out.size() / dtype_size(t.entry.dtype);
  constexpr float kMatrixHalfWidth = 0.02f * 1.7320508f;  // uniform with std 0.02
  std::vector<float> values(n);
  for (float& v : values) {
    switch (t.fill) {
      case Fill::kMatrix:
        v = kMatrixHalfWidth * rng.uniform();
        break;
      case Fill::kOnes:
        v = 1.0f;
        break;
      case Fill::kZeros:
        v = 0.0f;
        break;
      case Fill::kALog:  // A in [1, 16), as transformers initialises it
        v = std::log(8.5f + 7.5f * rng.uniform());
        break;
      case Fill::kDtBias:
        v = 1.0f;
        break;
      case Fill::kConv:
        v = 0.5f * rng.uniform();
        break;
    }
  }
  if (t.entry.dtype == DType::kF32) {
    std::memcpy(out.data(), values.data(), out.size());
  } else {
    auto* bits = reinterpret_cast<uint16_t*>(out.data());
    for (size_t i = 0; i < n; ++i) bits[i] = f32_to_bf16(values[i]);
  }
}

}  // namespace

std::vector<std::string> synth_preset_names() {
  std::vector<std::string> names;
  for (const SynthShape& p : kPresets) names.push_back(p.name);
  return names;
}

const SynthShape& synth_preset(const std::string& name) {
  for (const SynthShape& p : kPresets) {
    if (name == p.name) return p;
  }
  std::string known;
  for (const SynthShape& p : kPresets) known += std::string(known.empty() ? "" : ", ") + p.name;
  fail("--preset", "'" + name + "' is not one of " + known);
}

void write_synthetic_checkpoint(const SynthShape& p, const fs::path& out, uint64_t seed,
                                const SynthVision* vision) {
  if (fs::exists(out)) fail(out.string(), "already exists");
  const Json config = synthetic_config_json(p, vision);  // refuses a tower on a text model
  fs::create_directories(out);
  std::ofstream(out / "config.json") << config.dump(2) << "\n";
  if (vision != nullptr) {  // the released settings: 65,536 to 16,777,216 pixels
    const Json preprocessor = {{"image_processor_type", "Qwen2VLImageProcessorFast"},
                               {"processor_class", "Qwen3VLProcessor"},
                               {"do_convert_rgb", true},
                               {"do_normalize", true},
                               {"do_rescale", true},
                               {"do_resize", true},
                               {"image_mean", {0.5, 0.5, 0.5}},
                               {"image_std", {0.5, 0.5, 0.5}},
                               {"merge_size", 2},
                               {"patch_size", 16},
                               {"resample", 3},
                               {"rescale_factor", 1.0 / 255.0},
                               {"size", {{"longest_edge", 16777216}, {"shortest_edge", 65536}}},
                               {"temporal_patch_size", 2}};
    std::ofstream(out / "preprocessor_config.json") << preprocessor.dump(2) << "\n";
  }
  const Json generation = {{"eos_token_id", p.hybrid ? Json{248044} : Json{151645, 151643}},
                           {"do_sample", false}};
  std::ofstream(out / "generation_config.json") << generation.dump(2) << "\n";
  const std::vector<SynthTensor> tensors = tensor_list(p, vision);
  std::vector<SafetensorsEntry> entries;
  for (const SynthTensor& t : tensors) entries.push_back(t.entry);
  write_safetensors(out / "model.safetensors", entries, [&](size_t i, std::span<std::byte> bytes) {
    fill_tensor(tensors[i], seed + i, bytes);
  });
}

}  // namespace qhx
