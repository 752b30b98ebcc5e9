#include "models/blocks.h"

#include <cmath>

#include "kernels/attention.h"
#include "kernels/delta_rule.h"
#include "kernels/elementwise.h"
#include "kernels/matmul.h"
#include "kernels/cpu_context.h"

namespace qhx {
namespace {

// Buffer `slot` of the context's caller scratch with room for n floats. The blocks run one at a
// time and each writes every element of a buffer before reading it, so they share slots.
float* scratch(CpuContext& cx, int slot, int64_t n) {
  return cx.caller_scratch().buffer<float>(Scratch::kFirstCallerSlot + slot, n);
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

void attention_forward(CpuContext& cx, const AttentionWeights& w, const AttentionParams& p, int64_t n_tokens,
                       int64_t first_pos, const float* x, LayerState& cache, float* out) {
  const int64_t hd = p.shape.head_dim, n_heads = p.shape.n_heads, n_kv = p.shape.n_kv_heads;
  const int64_t q_width = n_heads * hd, kv_width = n_kv * hd;
  float* q = scratch(cx, 0, n_tokens * q_width);
  float* gate = scratch(cx, 1, p.output_gate ? n_tokens * q_width : 0);
  // K and V go straight into the cache's new rows (normed and rotated there).
  cache.keys.resize((first_pos + n_tokens) * kv_width);
  cache.values.resize((first_pos + n_tokens) * kv_width);
  float* k = cache.keys.data() + first_pos * kv_width;
  float* v = cache.values.data() + first_pos * kv_width;
  // With an output gate, q_proj yields [q_0 | g_0 | q_1 | g_1 | ...] per head, split below.
  float* both = p.output_gate ? scratch(cx, 4, n_tokens * 2 * q_width) : q;
  matmul(cx, x, n_tokens, {{w.q_proj, both}, {w.k_proj, k}, {w.v_proj, v}});

  // Per token, the gate split off, per-head q/k RMSNorm, then RoPE at the token's absolute
  // position; tokens spread over the kernel threads (the same arithmetic wherever they fall).
  cx.split_rows(n_tokens, 1, n_tokens * (q_width + kv_width), [&](int64_t begin, int64_t end) {
    std::vector<float> cos(p.rotary_dim / 2), sin(p.rotary_dim / 2);
    for (int64_t t = begin; t < end; ++t) {
      for (int64_t h = 0; p.output_gate && h < n_heads; ++h) {
        const float* src = both + (t * n_heads + h) * 2 * hd;
        std::copy(src, src + hd, q + (t * n_heads + h) * hd);
        std::copy(src + hd, src + 2 * hd, gate + (t * n_heads + h) * hd);
      }
      float* qt = q + t * q_width;
      float* kt = k + t * kv_width;
      for (int64_t h = 0; h < n_heads; ++h) {
        rms_norm(cx, qt + h * hd, w.q_norm.data(), hd, p.norm_eps, qt + h * hd);
      }
      for (int64_t h = 0; h < n_kv; ++h) {
        rms_norm(cx, kt + h * hd, w.k_norm.data(), hd, p.norm_eps, kt + h * hd);
      }
      for (size_t i = 0; i < p.inv_freq.size(); ++i) {
        const float angle = static_cast<float>(first_pos + t) * p.inv_freq[i];
        cos[i] = std::cos(angle);
        sin[i] = std::sin(angle);
      }
      rope_rotate_half(cx, qt, n_heads, hd, p.rotary_dim, cos.data(), sin.data());
      rope_rotate_half(cx, kt, n_kv, hd, p.rotary_dim, cos.data(), sin.data());
    }
  });

  float* attn = scratch(cx, 4, n_tokens * q_width);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  causal_attention(cx, q, n_tokens, first_pos, cache.keys.data(), cache.values.data(), p.shape, scale,
                   attn);
  if (p.output_gate) sigmoid_gate(cx, gate, n_tokens * q_width, attn);
  matmul(cx, attn, n_tokens, w.o_proj, out);
}

void gated_deltanet_forward(CpuContext& cx, const GatedDeltaNetWeights& w, const GatedDeltaNetParams& p,
                            int64_t n_tokens, const float* x, LayerState& state, float* out) {
  const int64_t kd = p.key_width(), vd = p.value_width(), channels = p.conv_channels();
  const int64_t hv = p.heads.n_v_heads, dk = p.heads.k_dim, dv = p.heads.v_dim;

  // Step 1: projections.
  float* mixed = scratch(cx, 0, n_tokens * channels);
  float* z = scratch(cx, 1, n_tokens * vd);
  float* b = scratch(cx, 2, n_tokens * hv);
  float* a = scratch(cx, 3, n_tokens * hv);
  matmul(cx, x, n_tokens,
         {{w.in_proj_qkv, mixed}, {w.in_proj_z, z}, {w.in_proj_b, b}, {w.in_proj_a, a}});

  // Step 2: causal depthwise conv + SiLU on the q|k|v channels, continuing the conv state.
  float* conv_out = scratch(cx, 4, n_tokens * channels);
  causal_conv1d_silu(cx, mixed, n_tokens, channels, w.conv.data(), p.conv_kernel, state.conv.data(),
                     conv_out);

  // Steps 3 and 6: split, L2-normalise q and k per key head, scale q by dk^-1/2.
  float* q = scratch(cx, 5, n_tokens * kd);
  float* k = scratch(cx, 6, n_tokens * kd);
  float* v = scratch(cx, 7, n_tokens * vd);
  const float q_scale = 1.0f / std::sqrt(static_cast<float>(dk));
  for (int64_t t = 0; t < n_tokens; ++t) {
    const float* row = conv_out + t * channels;
    std::copy(row, row + kd, q + t * kd);
    std::copy(row + kd, row + 2 * kd, k + t * kd);
    std::copy(row + 2 * kd, row + channels, v + t * vd);
    for (int64_t h = 0; h < p.heads.n_k_heads; ++h) {
      float* qh = q + t * kd + h * dk;
      l2_normalize(cx, qh, dk, 1e-6f);
      for (int64_t d = 0; d < dk; ++d) qh[d] *= q_scale;
      l2_normalize(cx, k + t * kd + h * dk, dk, 1e-6f);
    }
  }

  // Step 4: gates. β = σ(b); g = −exp(A_log) · softplus(a + dt_bias), softplus threshold 20.
  // β and g overwrite b and a in place (each element is read once, then written).
  float* beta = b;
  float* g = a;
  for (int64_t t = 0; t < n_tokens; ++t) {
    for (int64_t j = 0; j < hv; ++j) {
      const int64_t i = t * hv + j;
      beta[i] = 1.0f / (1.0f + std::exp(-b[i]));
      const float s = a[i] + w.dt_bias[j];
      const float softplus = s > 20.0f ? s : std::log1p(std::exp(s));
      g[i] = -std::exp(w.a_log[j]) * softplus;
    }
  }

  // Steps 5 and 7: the gated delta rule (value head j reads key head j / (Hv/Hk)).
  float* core = scratch(cx, 8, n_tokens * vd);
  if (n_tokens == 1) {
    gated_delta_rule_recurrent(cx, q, k, v, beta, g, 1, p.heads, state.recurrent.data(), core);
  } else {
    gated_delta_rule_chunked(cx, q, k, v, beta, g, n_tokens, p.heads, p.chunk, state.recurrent.data(),
                             core);
  }

  // Step 8: per value head, RMSNorm (plain scale) then gate with silu(z); out_proj.
  rms_norm_rows(cx, core, w.norm.data(), n_tokens * hv, dv, p.norm_eps, core);
  silu_mul(cx, z, core, n_tokens * hv * dv, core);
  matmul(cx, core, n_tokens, w.out_proj, out);
}

void mlp_forward(CpuContext& cx, const MlpWeights& w, int64_t n_tokens, const float* x, float* out) {
  const int64_t inner = w.gate_proj.rows;
  float* gate = scratch(cx, 0, n_tokens * inner);
  float* up = scratch(cx, 1, n_tokens * inner);
  matmul(cx, x, n_tokens, {{w.gate_proj, gate}, {w.up_proj, up}});
  silu_mul(cx, gate, up, n_tokens * inner, gate);
  matmul(cx, gate, n_tokens, w.down_proj, out);
}

}  // namespace qhx
