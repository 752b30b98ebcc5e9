#include "models/weights.h"

#include <algorithm>

#include "util/error.h"
#include "util/json_file.h"

namespace qhx {
namespace {

bool is_float(DType d) {
  return d == DType::kF32 || d == DType::kBF16 || d == DType::kF16;
}

void require_float(const TensorView& t, bool quantized_ok) {
  if (!is_float(t.dtype) && !(quantized_ok && is_quantized(t.dtype))) {
    fail(t.file->string() + ": tensor '" + t.name + "'",
         "dtype " + std::string(dtype_name(t.dtype)) + " is not a weight type qhx reads here");
  }
}

}  // namespace

MatrixRef WeightReader::matrix(const std::string& name, int64_t rows, int64_t cols) const {
  const TensorView& t = checkpoint_.require(prefix_ + name, {rows, cols});
  require_float(t, /*quantized_ok=*/true);
  MatrixRef m{t.dtype, t.data, rows, cols};
  m.scales = t.scales;
  m.group_size = t.group_size;
  m.buffer = t.buffer;
  if (int8_activations_) m.activations = Activations::kInt8;  // float matrices ignore it
  return m;
}

std::vector<float> WeightReader::f32(const std::string& name,
                                     std::initializer_list<int64_t> shape) const {
  const TensorView& t = checkpoint_.require(prefix_ + name, shape);
  require_float(t, /*quantized_ok=*/false);
  const MatrixRef all{t.dtype, t.data, 1, t.numel()};
  std::vector<float> out(t.numel());
  ref::read_row(all, 0, out.data());
  return out;
}

std::vector<float> WeightReader::one_plus(const std::string& name, int64_t n) const {
  std::vector<float> w = f32(name, {n});
  for (float& x : w) x = 1.0f + x;
  return w;
}

void check_sizes_against_weights(const ModelConfig& c, const Checkpoint& checkpoint,
                                 const std::string& config_where) {
  const std::string p = text_decoder_prefix(checkpoint);
  // `key`'s value against what dimension `dim` of tensor `name` holds (divided by `per`).
  const auto agree = [&](const char* key, int64_t value, const std::string& name, size_t dim,
                         int64_t per = 1) {
    const TensorView* t = checkpoint.find(name);
    if (t == nullptr || t->shape.size() <= dim || per <= 0) return;
    const int64_t holds = t->shape[dim];
    if (holds == value * per) return;
    const std::string implied = holds % per == 0
                                    ? std::to_string(holds / per)
                                    : std::to_string(holds) + " / " + std::to_string(per);
    fail(field(config_where, key),
         "is " + std::to_string(value) +
             " (as given, or transformers' default where null or absent), "
             "but " +
             t->file->filename().string() + "'s '" + name + "' (shape " + t->shape_string() +
             ") holds " + implied + ": one of the two is wrong");
  };
  agree("vocab_size", c.vocab_size, p + "embed_tokens.weight", 0);
  agree("hidden_size", c.hidden_size, p + "embed_tokens.weight", 1);
  agree("intermediate_size", c.intermediate_size, p + "layers.0.mlp.gate_proj.weight", 0);
  // [linear attention, full attention]: a kind the model has no layer of counts as checked.
  bool checked[2] = {
      std::count(c.layer_types.begin(), c.layer_types.end(), LayerKind::kLinearAttention) == 0,
      std::count(c.layer_types.begin(), c.layer_types.end(), LayerKind::kFullAttention) == 0};
  for (int64_t i = 0; i < c.num_layers; ++i) {
    if (checked[c.layer_types[i] == LayerKind::kFullAttention]) continue;
    const std::string l = p + "layers." + std::to_string(i) + ".";
    if (c.layer_types[i] == LayerKind::kFullAttention) {
      agree("head_dim", c.head_dim, l + "self_attn.k_norm.weight", 0);
      agree("num_key_value_heads", c.num_kv_heads, l + "self_attn.k_proj.weight", 0, c.head_dim);
      agree("num_attention_heads", c.num_heads, l + "self_attn.o_proj.weight", 1, c.head_dim);
    } else {
      agree("linear_num_value_heads", c.linear_num_value_heads, l + "linear_attn.A_log", 0);
      agree("linear_value_head_dim", c.linear_value_head_dim, l + "linear_attn.norm.weight", 0);
      agree("linear_conv_kernel_dim", c.linear_conv_kernel_dim, l + "linear_attn.conv1d.weight", 2);
    }
    checked[c.layer_types[i] == LayerKind::kFullAttention] = true;
    if (checked[0] && checked[1]) break;  // one layer of each kind
  }
  const std::string past = p + "layers." + std::to_string(c.num_layers) + ".input_layernorm.weight";
  if (const TensorView* t = checkpoint.find(past)) {
    fail(field(config_where, "num_hidden_layers"), "is " + std::to_string(c.num_layers) + ", but " +
                                                       t->file->filename().string() + " holds '" +
                                                       past + "': the weights have more layers");
  }
}

std::string text_decoder_prefix(const Checkpoint& checkpoint) {
  if (checkpoint.contains("model.language_model.embed_tokens.weight")) {
    return "model.language_model.";
  }
  // A base model saved alone (Qwen3-Embedding's checkpoints): transformers loads it either way.
  if (!checkpoint.contains("model.embed_tokens.weight") &&
      checkpoint.contains("embed_tokens.weight")) {
    return "";
  }
  return "model.";
}

MatrixRef lm_head_or_tied(const Checkpoint& checkpoint, const ModelConfig& config,
                          const MatrixRef& embed_tokens) {
  if (checkpoint.contains("lm_head.weight")) {
    return WeightReader(checkpoint, "", config.int8_activations)
        .matrix("lm_head.weight", config.vocab_size, config.hidden_size);
  }
  if (!config.tie_word_embeddings) {
    // A base model saved alone (an embedding checkpoint such as Qwen3-Embedding-8B) has no head:
    // it computes final-norm rows, and a pass that wants logits says why it cannot.
    if (text_decoder_prefix(checkpoint).empty()) return MatrixRef{};
    fail(checkpoint.dir().string(),
         "missing tensor 'lm_head.weight' and config.json says tie_word_embeddings is false");
  }
  return embed_tokens;
}

}  // namespace qhx
