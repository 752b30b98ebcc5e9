// Qwen3 forward pass, written to read like spec §2.4.
#include "models/qwen3.h"

#include <cmath>
#include <string>

#include "kernels/kernels.h"
#include "util/error.h"

namespace qhx {
namespace {

MatrixRef as_matrix(const TensorView& t) {
  if (t.dtype != DType::kF32 && t.dtype != DType::kBF16 && t.dtype != DType::kF16) {
    fail(t.file->string() + ": tensor '" + t.name + "'",
         "dtype " + std::string(dtype_name(t.dtype)) + " is not a float weight type");
  }
  return MatrixRef{t.dtype, t.data, t.shape[0], t.shape.size() > 1 ? t.shape[1] : 1};
}

std::vector<float> to_f32(const TensorView& t) {
  const MatrixRef m = as_matrix(t);
  std::vector<float> out(m.rows * m.cols);
  for (int64_t r = 0; r < m.rows; ++r) ref::read_row(m, r, out.data() + r * m.cols);
  return out;
}

struct Layer {
  std::vector<float> input_norm, post_attention_norm, q_norm, k_norm;
  MatrixRef q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj;
};

class Qwen3State final : public ModelState {
 public:
  Qwen3State(int64_t n_layers, int64_t kv_width) : keys(n_layers), values(n_layers),
                                                   kv_width_(kv_width) {}
  int64_t n_past() const override { return n_past_; }
  void reset() override {
    for (auto& k : keys) k.clear();
    for (auto& v : values) v.clear();
    n_past_ = 0;
  }
  void advance(int64_t n) { n_past_ += n; }
  int64_t kv_width() const { return kv_width_; }

  // Per layer: [n_past, n_kv_heads·head_dim], K after q/k-norm and RoPE, V as projected.
  std::vector<std::vector<float>> keys, values;

 private:
  int64_t kv_width_;
  int64_t n_past_ = 0;
};

class Qwen3Model final : public Model {
 public:
  Qwen3Model(const ModelConfig& config, Checkpoint checkpoint);
  const ModelConfig& config() const override { return config_; }
  std::unique_ptr<ModelState> new_state() const override {
    return std::make_unique<Qwen3State>(config_.num_layers, config_.num_kv_heads * config_.head_dim);
  }
  void forward(std::span<const int32_t> ids, ModelState& state, LogitsFor which,
               std::vector<float>& logits) const override;

 private:
  void attention_block(const Layer& layer, int64_t layer_index, int64_t n_tokens,
                       Qwen3State& state, float* hidden) const;
  void mlp_block(const Layer& layer, int64_t n_tokens, float* hidden) const;
  void rope_tables(int64_t position, float* cos, float* sin) const;

  ModelConfig config_;
  Checkpoint checkpoint_;  // owns the mappings every MatrixRef points into
  MatrixRef embed_tokens_, lm_head_;
  std::vector<Layer> layers_;
  std::vector<float> final_norm_;
  std::vector<float> inv_freq_;  // RoPE frequencies, f32 as HF computes them (spec §1.3)
};

Qwen3Model::Qwen3Model(const ModelConfig& config, Checkpoint checkpoint)
    : config_(config), checkpoint_(std::move(checkpoint)) {
  const ModelConfig& c = config_;
  const int64_t H = c.hidden_size, I = c.intermediate_size, hd = c.head_dim;
  const int64_t q_width = c.num_heads * hd, kv_width = c.num_kv_heads * hd;
  const std::string prefix = checkpoint_.contains("model.language_model.embed_tokens.weight")
                                 ? "model.language_model."
                                 : "model.";
  embed_tokens_ = as_matrix(checkpoint_.require(prefix + "embed_tokens.weight", {c.vocab_size, H}));
  if (checkpoint_.contains("lm_head.weight")) {
    lm_head_ = as_matrix(checkpoint_.require("lm_head.weight", {c.vocab_size, H}));
  } else if (c.tie_word_embeddings) {
    lm_head_ = embed_tokens_;
  } else {
    fail(checkpoint_.dir().string(),
         "missing tensor 'lm_head.weight' and config.json says tie_word_embeddings is false");
  }
  final_norm_ = to_f32(checkpoint_.require(prefix + "norm.weight", {H}));
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const std::string p = prefix + "layers." + std::to_string(i) + ".";
    Layer l;
    l.input_norm = to_f32(checkpoint_.require(p + "input_layernorm.weight", {H}));
    l.post_attention_norm = to_f32(checkpoint_.require(p + "post_attention_layernorm.weight", {H}));
    l.q_norm = to_f32(checkpoint_.require(p + "self_attn.q_norm.weight", {hd}));
    l.k_norm = to_f32(checkpoint_.require(p + "self_attn.k_norm.weight", {hd}));
    l.q_proj = as_matrix(checkpoint_.require(p + "self_attn.q_proj.weight", {q_width, H}));
    l.k_proj = as_matrix(checkpoint_.require(p + "self_attn.k_proj.weight", {kv_width, H}));
    l.v_proj = as_matrix(checkpoint_.require(p + "self_attn.v_proj.weight", {kv_width, H}));
    l.o_proj = as_matrix(checkpoint_.require(p + "self_attn.o_proj.weight", {H, q_width}));
    l.gate_proj = as_matrix(checkpoint_.require(p + "mlp.gate_proj.weight", {I, H}));
    l.up_proj = as_matrix(checkpoint_.require(p + "mlp.up_proj.weight", {I, H}));
    l.down_proj = as_matrix(checkpoint_.require(p + "mlp.down_proj.weight", {H, I}));
    layers_.push_back(std::move(l));
  }
  inv_freq_.resize(hd / 2);
  const float theta = static_cast<float>(c.rope_theta);
  for (int64_t i = 0; i < hd / 2; ++i) {
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(hd);
    inv_freq_[i] = 1.0f / std::pow(theta, exponent);
  }
}

void Qwen3Model::rope_tables(int64_t position, float* cos, float* sin) const {
  for (size_t i = 0; i < inv_freq_.size(); ++i) {
    const float angle = static_cast<float>(position) * inv_freq_[i];
    cos[i] = std::cos(angle);
    sin[i] = std::sin(angle);
  }
}

void Qwen3Model::attention_block(const Layer& layer, int64_t layer_index, int64_t n_tokens,
                                 Qwen3State& state, float* hidden) const {
  const ModelConfig& c = config_;
  const int64_t H = c.hidden_size, hd = c.head_dim;
  const int64_t q_width = c.num_heads * hd, kv_width = c.num_kv_heads * hd;
  const int64_t first_pos = state.n_past();
  const auto eps = static_cast<float>(c.rms_norm_eps);

  std::vector<float> x(n_tokens * H), q(n_tokens * q_width), k(n_tokens * kv_width),
      v(n_tokens * kv_width);
  for (int64_t t = 0; t < n_tokens; ++t) {
    ref::rms_norm(hidden + t * H, layer.input_norm.data(), H, eps, x.data() + t * H);
  }
  ref::matmul(x.data(), n_tokens, layer.q_proj, q.data());
  ref::matmul(x.data(), n_tokens, layer.k_proj, k.data());
  ref::matmul(x.data(), n_tokens, layer.v_proj, v.data());

  std::vector<float> cos(hd / 2), sin(hd / 2);
  for (int64_t t = 0; t < n_tokens; ++t) {
    float* qt = q.data() + t * q_width;
    float* kt = k.data() + t * kv_width;
    for (int64_t h = 0; h < c.num_heads; ++h) {
      ref::rms_norm(qt + h * hd, layer.q_norm.data(), hd, eps, qt + h * hd);
    }
    for (int64_t h = 0; h < c.num_kv_heads; ++h) {
      ref::rms_norm(kt + h * hd, layer.k_norm.data(), hd, eps, kt + h * hd);
    }
    rope_tables(first_pos + t, cos.data(), sin.data());
    ref::rope_rotate_half(qt, c.num_heads, hd, hd, cos.data(), sin.data());
    ref::rope_rotate_half(kt, c.num_kv_heads, hd, hd, cos.data(), sin.data());
  }

  auto& keys = state.keys[layer_index];
  auto& values = state.values[layer_index];
  keys.insert(keys.end(), k.begin(), k.end());
  values.insert(values.end(), v.begin(), v.end());

  std::vector<float> attn(n_tokens * q_width), scores(first_pos + n_tokens), o(n_tokens * H);
  const AttentionShape shape{c.num_heads, c.num_kv_heads, hd};
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  ref::causal_attention(q.data(), n_tokens, first_pos, keys.data(), values.data(), shape, scale,
                        attn.data(), scores.data());
  ref::matmul(attn.data(), n_tokens, layer.o_proj, o.data());
  for (int64_t i = 0; i < n_tokens * H; ++i) hidden[i] += o[i];
}

void Qwen3Model::mlp_block(const Layer& layer, int64_t n_tokens, float* hidden) const {
  const int64_t H = config_.hidden_size, I = config_.intermediate_size;
  const auto eps = static_cast<float>(config_.rms_norm_eps);
  std::vector<float> x(n_tokens * H), gate(n_tokens * I), up(n_tokens * I), down(n_tokens * H);
  for (int64_t t = 0; t < n_tokens; ++t) {
    ref::rms_norm(hidden + t * H, layer.post_attention_norm.data(), H, eps, x.data() + t * H);
  }
  ref::matmul(x.data(), n_tokens, layer.gate_proj, gate.data());
  ref::matmul(x.data(), n_tokens, layer.up_proj, up.data());
  ref::silu_mul(gate.data(), up.data(), n_tokens * I, gate.data());
  ref::matmul(gate.data(), n_tokens, layer.down_proj, down.data());
  for (int64_t i = 0; i < n_tokens * H; ++i) hidden[i] += down[i];
}

void Qwen3Model::forward(std::span<const int32_t> ids, ModelState& base_state, LogitsFor which,
                         std::vector<float>& logits) const {
  auto& state = dynamic_cast<Qwen3State&>(base_state);
  const ModelConfig& c = config_;
  const auto n_tokens = static_cast<int64_t>(ids.size());
  if (n_tokens == 0) fail("forward", "no tokens to process");
  if (state.n_past() + n_tokens > c.max_position_embeddings) {
    fail("context", std::to_string(state.n_past() + n_tokens) +
                        " tokens exceed the model's max_position_embeddings (" +
                        std::to_string(c.max_position_embeddings) + ")");
  }
  const int64_t H = c.hidden_size;
  std::vector<float> hidden(n_tokens * H);
  for (int64_t t = 0; t < n_tokens; ++t) {
    if (ids[t] < 0 || ids[t] >= c.vocab_size) {
      fail("token ids", "id " + std::to_string(ids[t]) + " is outside the vocabulary [0, " +
                            std::to_string(c.vocab_size) + ")");
    }
    ref::read_row(embed_tokens_, ids[t], hidden.data() + t * H);
  }
  for (int64_t i = 0; i < c.num_layers; ++i) {
    attention_block(layers_[i], i, n_tokens, state, hidden.data());
    mlp_block(layers_[i], n_tokens, hidden.data());
  }
  state.advance(n_tokens);

  const int64_t first_out = which == LogitsFor::kEveryToken ? 0 : n_tokens - 1;
  const int64_t n_out = n_tokens - first_out;
  std::vector<float> normed(n_out * H);
  for (int64_t t = 0; t < n_out; ++t) {
    ref::rms_norm(hidden.data() + (first_out + t) * H, final_norm_.data(), H,
                  static_cast<float>(c.rms_norm_eps), normed.data() + t * H);
  }
  logits.resize(n_out * c.vocab_size);
  ref::matmul(normed.data(), n_out, lm_head_, logits.data());
}

}  // namespace

std::unique_ptr<Model> load_qwen3(const ModelConfig& config, Checkpoint checkpoint) {
  return std::make_unique<Qwen3Model>(config, std::move(checkpoint));
}

}  // namespace qhx
