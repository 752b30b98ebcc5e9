// Qwen3.5 hybrid (spec §3): Gated DeltaNet linear-attention layers and gated full-attention
// layers as layer_types lists them. Decoder, final and q/k norms are zero-centred (scale 1 + w);
// the DeltaNet output norm is a plain scale. Attention rotates only the first rotary_dim dims.
#include "models/decoder.h"
#include "models/families.h"
#include "models/weights.h"

#include <algorithm>

#include "kernels/kernels.h"
#include "util/error.h"

namespace qhx {
namespace {

// A gated full-attention layer's attention weights under `p` (q_proj yields query and gate).
AttentionWeights read_gated_attention(const WeightReader& r, const std::string& p,
                                      const ModelConfig& c) {
  const int64_t H = c.hidden_size, hd = c.head_dim;
  const int64_t q_width = c.num_heads * hd, kv_width = c.num_kv_heads * hd;
  AttentionWeights a;
  a.q_proj = r.matrix(p + "self_attn.q_proj.weight", 2 * q_width, H);  // query + gate
  a.k_proj = r.matrix(p + "self_attn.k_proj.weight", kv_width, H);
  a.v_proj = r.matrix(p + "self_attn.v_proj.weight", kv_width, H);
  a.o_proj = r.matrix(p + "self_attn.o_proj.weight", H, q_width);
  a.q_norm = r.one_plus(p + "self_attn.q_norm.weight", hd);
  a.k_norm = r.one_plus(p + "self_attn.k_norm.weight", hd);
  return a;
}

// The multi-token-prediction head (top-level mtp.*, in text and multimodal layouts alike), read
// once every tensor of it is there. Only its first layer is read: one draft step per
// layer is how the serving engines use it, and Qwen3.5 checkpoints carry one
// (mtp_num_hidden_layers: 1).
MtpWeights read_mtp(const Checkpoint& checkpoint, const ModelConfig& c) {
  const WeightReader mtp(checkpoint, "mtp.", c.int8_activations);
  const int64_t H = c.hidden_size;
  MtpWeights w;
  w.embedding_norm = mtp.one_plus("pre_fc_norm_embedding.weight", H);
  w.hidden_norm = mtp.one_plus("pre_fc_norm_hidden.weight", H);
  w.final_norm = mtp.one_plus("norm.weight", H);
  // fc · [e ; h] = fc[:, :H] · e + fc[:, H:] · h: the halves, row by row, in f32.
  const MatrixRef fc = mtp.matrix("fc.weight", H, 2 * H);
  w.fc_embedding_rows.resize(H * H);
  w.fc_hidden_rows.resize(H * H);
  std::vector<float> row(2 * H);
  for (int64_t r = 0; r < H; ++r) {
    ref::read_row(fc, r, row.data());
    std::copy_n(row.begin(), H, w.fc_embedding_rows.begin() + r * H);
    std::copy_n(row.begin() + H, H, w.fc_hidden_rows.begin() + r * H);
  }
  w.fc_embedding = {DType::kF32, w.fc_embedding_rows.data(), H, H};
  w.fc_hidden = {DType::kF32, w.fc_hidden_rows.data(), H, H};
  DecoderLayer& l = w.layer;
  l.kind = LayerKind::kFullAttention;
  l.input_norm = mtp.one_plus("layers.0.input_layernorm.weight", H);
  l.post_attention_norm = mtp.one_plus("layers.0.post_attention_layernorm.weight", H);
  l.attention = read_gated_attention(mtp, "layers.0.", c);
  l.mlp = read_mlp(mtp, "layers.0.", c);
  return w;
}

// The head, or why the checkpoint's mtp.* tensors are not one (`why`). transformers ignores
// every mtp.* tensor, so a module missing tensors or holding ones of another shape or type
// leaves the model a text model.
std::optional<MtpWeights> read_mtp_or_why(const Checkpoint& checkpoint, const ModelConfig& c,
                                          std::string& why) {
  why.clear();
  if (!has_mtp_tensors(checkpoint)) return std::nullopt;
  std::string missing;
  int n = 0;
  for (const std::string& name : mtp_head_tensors()) {
    if (checkpoint.contains(name)) continue;
    missing += (n++ == 0 ? "" : ", ") + name;
  }
  if (n > 0) {
    why = "its MTP head (mtp.*) is incomplete, missing " + std::to_string(n) + " of " +
          std::to_string(mtp_head_tensors().size()) + " tensors: " + missing;
    return std::nullopt;
  }
  try {
    return read_mtp(checkpoint, c);  // shapes and types checked as the model's own tensors
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::kInvalidInput) throw;
    why = std::string("its MTP head (mtp.*) is not usable: ") + e.what();
    return std::nullopt;
  }
}

}  // namespace

const std::vector<std::string>& mtp_head_tensors() {
  static const std::vector<std::string> names = {
      "mtp.fc.weight",
      "mtp.pre_fc_norm_embedding.weight",
      "mtp.pre_fc_norm_hidden.weight",
      "mtp.norm.weight",
      "mtp.layers.0.input_layernorm.weight",
      "mtp.layers.0.post_attention_layernorm.weight",
      "mtp.layers.0.self_attn.q_proj.weight",
      "mtp.layers.0.self_attn.k_proj.weight",
      "mtp.layers.0.self_attn.v_proj.weight",
      "mtp.layers.0.self_attn.o_proj.weight",
      "mtp.layers.0.self_attn.q_norm.weight",
      "mtp.layers.0.self_attn.k_norm.weight",
      "mtp.layers.0.mlp.gate_proj.weight",
      "mtp.layers.0.mlp.up_proj.weight",
      "mtp.layers.0.mlp.down_proj.weight",
  };
  return names;
}

bool has_mtp_tensors(const Checkpoint& checkpoint) {
  for (const auto& file : checkpoint.files()) {
    for (const auto& [name, view] : file->tensors()) {
      if (name.starts_with("mtp.")) return true;
    }
  }
  return false;
}

std::string mtp_head_unusable(const Checkpoint& checkpoint, const ModelConfig& c) {
  std::string why;
  read_mtp_or_why(checkpoint, c, why);
  return why;
}

std::unique_ptr<Model> load_qwen3_5(const ModelConfig& c, Checkpoint checkpoint,
                                    std::shared_ptr<CpuContext> context,
                                    std::vector<std::shared_ptr<Backend>> backends, KvType kv,
                                    const std::function<std::vector<int32_t>()>& mtp_vocab) {
  const int64_t H = c.hidden_size;
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
      l.attention = read_gated_attention(model, p, c);
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
  w.mtp = read_mtp_or_why(checkpoint, c, w.mtp_unavailable);
  if (w.mtp) {
    // Its logits are over the draft vocabulary when there is one (the lm_head's rows, copied
    // before packing releases them). That file is qhx's own, put there on purpose: a bad one is
    // refused.
    w.mtp->vocab = mtp_vocab();
    if (!w.mtp->vocab.empty()) w.mtp->vocab_head.emplace(w.lm_head, w.mtp->vocab);
  }

  return make_decoder(c, std::move(checkpoint), std::move(w),
                      attention_params(c, /*output_gate=*/true, kv), deltanet, std::move(context),
                      std::move(backends));
}

}  // namespace qhx
