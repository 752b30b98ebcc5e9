// Qwen3 dense (spec §2): every layer GQA attention with plain-scale q/k RMSNorm and full-width
// rotate-half RoPE; plain-scale RMSNorms; SwiGLU MLP.
#include "models/families.h"

#include "models/decoder.h"
#include "models/weights.h"

namespace qhx {

std::unique_ptr<Model> load_qwen3(const ModelConfig& c, Checkpoint checkpoint,
                                  std::shared_ptr<CpuContext> context,
                                  std::vector<std::shared_ptr<Backend>> backends, KvType kv) {
  const int64_t H = c.hidden_size, hd = c.head_dim;
  const int64_t q_width = c.num_heads * hd, kv_width = c.num_kv_heads * hd;
  const WeightReader model(checkpoint, text_decoder_prefix(checkpoint), c.int8_activations);

  DecoderWeights w;
  w.embed_tokens = model.matrix("embed_tokens.weight", c.vocab_size, H);
  w.lm_head = lm_head_or_tied(checkpoint, c, w.embed_tokens);
  w.final_norm = model.f32("norm.weight", {H});
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const std::string p = "layers." + std::to_string(i) + ".";
    DecoderLayer l;
    l.kind = LayerKind::kFullAttention;
    l.input_norm = model.f32(p + "input_layernorm.weight", {H});
    l.post_attention_norm = model.f32(p + "post_attention_layernorm.weight", {H});
    l.attention.q_proj = model.matrix(p + "self_attn.q_proj.weight", q_width, H);
    l.attention.k_proj = model.matrix(p + "self_attn.k_proj.weight", kv_width, H);
    l.attention.v_proj = model.matrix(p + "self_attn.v_proj.weight", kv_width, H);
    l.attention.o_proj = model.matrix(p + "self_attn.o_proj.weight", H, q_width);
    l.attention.q_norm = model.f32(p + "self_attn.q_norm.weight", {hd});
    l.attention.k_norm = model.f32(p + "self_attn.k_norm.weight", {hd});
    l.mlp = read_mlp(model, p, c);
    w.layers.push_back(std::move(l));
  }

  return make_decoder(c, std::move(checkpoint), std::move(w),
                      attention_params(c, /*output_gate=*/false, kv), {}, std::move(context),
                      std::move(backends));
}

}  // namespace qhx
