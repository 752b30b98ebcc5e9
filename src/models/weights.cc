#include "models/weights.h"

#include "util/error.h"

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

std::string text_decoder_prefix(const Checkpoint& checkpoint) {
  return checkpoint.contains("model.language_model.embed_tokens.weight") ? "model.language_model."
                                                                         : "model.";
}

MatrixRef lm_head_or_tied(const Checkpoint& checkpoint, const ModelConfig& config,
                          const MatrixRef& embed_tokens) {
  if (checkpoint.contains("lm_head.weight")) {
    return WeightReader(checkpoint, "", config.int8_activations)
        .matrix("lm_head.weight", config.vocab_size, config.hidden_size);
  }
  if (!config.tie_word_embeddings) {
    fail(checkpoint.dir().string(),
         "missing tensor 'lm_head.weight' and config.json says tie_word_embeddings is false");
  }
  return embed_tokens;
}

}  // namespace qhx
