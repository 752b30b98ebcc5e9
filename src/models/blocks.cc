#include "models/blocks.h"

#include <cmath>

namespace qhx {
namespace {

// A new activation of plan.n_tokens rows.
ValueId activation(Plan& plan, int64_t cols) {
  return plan.add_value(plan.n_tokens, cols);
}

// out = x · wᵀ, a node of its own (the backends fuse a run of them that share x); out is a new
// value unless given.
ValueId add_matmul(Plan& plan, ValueId x, const MatrixRef& w, ValueId out = kNoValue) {
  if (out == kNoValue) out = activation(plan, w.rows);
  Node& n = plan.add(Op::kMatmul);
  n.in[0] = {x};
  n.out = {out};
  n.rows = plan.n_tokens;
  n.matrix = &w;
  return out;
}

// Each `width` elements of v normalised in place with the weight `scale`.
void add_rms_norm(Plan& plan, ValueId v, int64_t width, const WeightVector& scale, float eps) {
  Node& n = plan.add(Op::kRmsNorm);
  n.in[0] = n.out = {v};
  n.rows = plan.n_tokens;
  n.width = width;
  n.vector = &scale;
  n.eps = eps;
}

}  // namespace

std::vector<float> rope_inv_freq(double theta, int64_t rotary_dim) {
  std::vector<float> inv_freq(rotary_dim / 2);
  const auto base = static_cast<float>(theta);
  for (int64_t i = 0; i < rotary_dim / 2; ++i) {
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(rotary_dim);
    inv_freq[i] = 1.0f / std::pow(base, exponent);
  }
  return inv_freq;
}

void add_rope(Plan& plan, ValueId v, int64_t head_dim, int64_t rotary_dim,
              const WeightVector& freqs, const int8_t* axes) {
  Node& rope = plan.add(Op::kRope);
  rope.out = {v};
  rope.rows = plan.n_tokens;
  rope.width = head_dim;
  rope.rotary_dim = rotary_dim;
  rope.vector = &freqs;
  rope.rope_axes = axes;
}

void add_attention(Plan& plan, const AttentionWeights& w, const AttentionParams& p, int layer,
                   ValueId x, ValueId y) {
  const int64_t n = plan.n_tokens, hd = p.shape.head_dim;
  const int64_t q_width = p.shape.n_heads * hd;
  // With an output gate, q_proj yields [q_h | g_h] for each head h (spec §3.6).
  const ValueId projected = add_matmul(plan, x, w.q_proj);
  const ValueId k = add_matmul(plan, x, w.k_proj);
  const ValueId v = add_matmul(plan, x, w.v_proj);
  ValueId q = projected, gate = kNoValue;
  if (p.output_gate) {
    q = activation(plan, q_width);
    gate = activation(plan, q_width);
    Node& split = plan.add(Op::kSplitHeads);
    split.in[0] = {projected};
    split.out = {q};
    split.out2 = {gate};
    split.rows = n;
    split.width = hd;
  }
  // Per-head RMSNorm of q and k, then RoPE at each token's absolute position.
  add_rms_norm(plan, q, hd, w.q_norm, p.norm_eps);
  add_rms_norm(plan, k, hd, w.k_norm, p.norm_eps);
  for (const ValueId rotated : {q, k})
    add_rope(plan, rotated, hd, p.rotary_dim, p.inv_freq, p.rope_axes);

  const ValueId attended = activation(plan, q_width);
  Node& attention = plan.add(Op::kAttention);
  attention.in[0] = {q};
  attention.in[1] = {k};
  attention.in[2] = {v};
  attention.out = {attended};
  attention.rows = n;
  attention.layer = layer;
  attention.attention = p.shape;
  attention.scale = 1.0f / std::sqrt(static_cast<float>(hd));
  if (p.output_gate) {
    Node& g = plan.add(Op::kSigmoidGate);
    g.in[0] = {gate};
    g.out = {attended};
    g.rows = n;
  }
  add_matmul(plan, attended, w.o_proj, y);
}

void add_gated_deltanet(Plan& plan, const GatedDeltaNetWeights& w, const GatedDeltaNetParams& p,
                        int layer, ValueId x, ValueId y) {
  const int64_t n = plan.n_tokens;
  const int64_t kd = p.key_width(), vd = p.value_width(), dk = p.heads.k_dim;

  // Step 1: projections.
  const ValueId mixed = add_matmul(plan, x, w.in_proj_qkv);
  const ValueId z = add_matmul(plan, x, w.in_proj_z);
  const ValueId b = add_matmul(plan, x, w.in_proj_b);
  const ValueId a = add_matmul(plan, x, w.in_proj_a);

  // Step 2: causal depthwise conv + SiLU on the q|k|v channels, continuing the conv state.
  const ValueId conv_out = activation(plan, p.conv_channels());
  Node& conv = plan.add(Op::kConvSilu);
  conv.in[0] = {mixed};
  conv.out = {conv_out};
  conv.rows = n;
  conv.width = p.conv_kernel;
  conv.vector = &w.conv;
  conv.layer = layer;

  // Steps 3 and 6: split, L2-normalise q and k per key head, scale q by dk^-1/2.
  ValueId qkv[3];
  const int64_t begin[3] = {0, kd, 2 * kd}, width[3] = {kd, kd, vd};
  for (int i = 0; i < 3; ++i) {
    qkv[i] = activation(plan, width[i]);
    Node& part = plan.add(Op::kCopyColumns);
    part.in[0] = {conv_out};
    part.out = {qkv[i]};
    part.rows = n;
    part.offset = begin[i];
  }
  for (const auto& [v, scale] :
       {std::pair{qkv[0], 1.0f / std::sqrt(static_cast<float>(dk))}, std::pair{qkv[1], 1.0f}}) {
    Node& l2 = plan.add(Op::kL2Norm);
    l2.out = {v};
    l2.rows = n;
    l2.width = dk;
    l2.scale = scale;
  }

  // Step 4: gates, in place: β = σ(b); g = −exp(A_log) · softplus(a + dt_bias).
  Node& gates = plan.add(Op::kDeltaGates);
  gates.out = {b};
  gates.out2 = {a};
  gates.rows = n;
  gates.vector = &w.a_log;
  gates.vector2 = &w.dt_bias;

  // Steps 5 and 7: the gated delta rule (value head j reads key head j / (Hv/Hk)).
  const ValueId core = activation(plan, vd);
  Node& rule = plan.add(Op::kDeltaRule);
  rule.in[0] = {qkv[0]};
  rule.in[1] = {qkv[1]};
  rule.in[2] = {qkv[2]};
  rule.in[3] = {b};
  rule.in[4] = {a};
  rule.out = {core};
  rule.rows = n;
  rule.layer = layer;
  rule.heads = p.heads;
  rule.chunk = p.chunk;

  // Step 8: per value head, RMSNorm (plain scale) then gate with silu(z); out_proj.
  add_rms_norm(plan, core, p.heads.v_dim, w.norm, p.norm_eps);
  Node& gated = plan.add(Op::kSiluMul);
  gated.in[0] = {z};
  gated.in[1] = {core};
  gated.out = {core};
  gated.rows = n;
  add_matmul(plan, core, w.out_proj, y);
}

void add_mlp(Plan& plan, const MlpWeights& w, ValueId x, ValueId y) {
  const ValueId gate = add_matmul(plan, x, w.gate_proj);
  const ValueId up = add_matmul(plan, x, w.up_proj);
  Node& act = plan.add(Op::kSiluMul);
  act.in[0] = {gate};
  act.in[1] = {up};
  act.out = {gate};
  act.rows = plan.n_tokens;
  add_matmul(plan, gate, w.down_proj, y);
}

}  // namespace qhx
