// Qwen3.5 hybrid (spec §3): Gated DeltaNet linear-attention layers and gated full-attention
// layers as layer_types lists them. Decoder, final and q/k norms are zero-centred (scale 1 + w);
// the DeltaNet output norm is a plain scale. Attention rotates only the first rotary_dim dims.
#include "models/decoder.h"
#include "models/families.h"
#include "models/weights.h"

namespace qhx {

std::unique_ptr<Model> load_qwen3_5(const ModelConfig& c, Checkpoint checkpoint,
                                    std::shared_ptr<CpuContext> context,
                                    std::vector<std::shared_ptr<Backend>> devices) {
  const int64_t H = c.hidden_size, hd = c.head_dim;
  const int64_t q_width = c.num_heads * hd, kv_width = c.num_kv_heads * hd;
  GatedDeltaNetParams deltanet;
  deltanet.heads = {c.linear_num_key_heads, c.linear_num_value_heads, c.linear_key_head_dim,
                    c.linear_value_head_dim};
  deltanet.conv_kernel = c.linear_conv_kernel_dim;
  deltanet.norm_eps = static_cast<float>(c.rms_norm_eps);
  deltanet.chunk = c.deltanet_chunk;
  const int64_t hv = deltanet.heads.n_v_heads, vd = deltanet.value_width();
  const int64_t channels = deltanet.conv_channels(), kernel = deltanet.conv_kernel;
  const WeightReader model(checkpoint, text_decoder_prefix(checkpoint), c.int8_activations);

  DecoderWeights w;
  w.embed_tokens = model.matrix("embed_tokens.weight", c.vocab_size, H);
  w.lm_head = lm_head_or_tied(checkpoint, c, w.embed_tokens);
  w.final_norm = model.one_plus("norm.weight", H);
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const std::string p = "layers." + std::to_string(i) + ".";
    DecoderLayer l;
    l.kind = c.layer_types[i];
    l.input_norm = model.one_plus(p + "input_layernorm.weight", H);
    l.post_attention_norm = model.one_plus(p + "post_attention_layernorm.weight", H);
    if (l.kind == LayerKind::kFullAttention) {
      AttentionWeights& a = l.attention;
      a.q_proj = model.matrix(p + "self_attn.q_proj.weight", 2 * q_width, H);  // query + gate
      a.k_proj = model.matrix(p + "self_attn.k_proj.weight", kv_width, H);
      a.v_proj = model.matrix(p + "self_attn.v_proj.weight", kv_width, H);
      a.o_proj = model.matrix(p + "self_attn.o_proj.weight", H, q_width);
      a.q_norm = model.one_plus(p + "self_attn.q_norm.weight", hd);
      a.k_norm = model.one_plus(p + "self_attn.k_norm.weight", hd);
    } else {
      GatedDeltaNetWeights& d = l.deltanet;
      const std::string q = p + "linear_attn.";
      d.in_proj_qkv = model.matrix(q + "in_proj_qkv.weight", channels, H);
      d.in_proj_z = model.matrix(q + "in_proj_z.weight", vd, H);
      d.in_proj_b = model.matrix(q + "in_proj_b.weight", hv, H);
      d.in_proj_a = model.matrix(q + "in_proj_a.weight", hv, H);
      d.out_proj = model.matrix(q + "out_proj.weight", H, vd);
      d.conv = model.f32(q + "conv1d.weight", {channels, 1, kernel});
      d.a_log = model.f32(q + "A_log", {hv});
      d.dt_bias = model.f32(q + "dt_bias", {hv});
      d.norm = model.f32(q + "norm.weight", {deltanet.heads.v_dim});
    }
    l.mlp = read_mlp(model, p, c);
    w.layers.push_back(std::move(l));
  }

  return make_decoder(c, std::move(checkpoint), std::move(w),
                      attention_params(c, /*output_gate=*/true), deltanet, std::move(context),
                      std::move(devices));
}

}  // namespace qhx
