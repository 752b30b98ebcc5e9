// The blocks decoder layers are made of, each a short sequence of plan nodes in the spec's order
// (graph/plan.h): softmax attention (Qwen3; Qwen3.5 adds an output gate and partial rotary),
// Gated DeltaNet linear attention (Qwen3.5), and the SwiGLU MLP. Each appends its nodes to a plan
// of n_tokens rows, reading x: [n_tokens, hidden] and writing y: [n_tokens, hidden]; fusions are
// the backends' business.
#pragma once

#include <cstdint>
#include <vector>

#include "graph/plan.h"
#include "kernels/kernels.h"

namespace qhx {

struct AttentionWeights {
  MatrixRef q_proj;  // [n_heads·head_dim, H], or with an output gate [n_heads·2·head_dim, H]
  MatrixRef k_proj, v_proj, o_proj;
  WeightVector q_norm, k_norm;  // [head_dim], effective scales (1 + w already added)
};

struct AttentionParams {
  AttentionShape shape;
  int64_t rotary_dim = 0;    // leading dims of each head that rotate (i ↔ i + rotary_dim/2)
  WeightVector inv_freq;     // rotary_dim / 2 RoPE frequencies
  bool output_gate = false;  // q_proj rows per head are [query | gate] (spec §3.6)
  const int8_t* rope_axes = nullptr;  // M-RoPE: each frequency's axis (Node::rope_axes), or none
  float norm_eps = 1e-6f;
};

// RoPE frequencies 1 / θ^(2i/R) in f32, as transformers computes them (spec §1.3).
std::vector<float> rope_inv_freq(double theta, int64_t rotary_dim);

// In place on v's heads of head_dim: RoPE of their first rotary_dim elements with `freqs`, at
// each row's position (with `axes`, M-RoPE's: Node::rope_axes).
void add_rope(Plan& plan, ValueId v, int64_t head_dim, int64_t rotary_dim,
              const WeightVector& freqs, const int8_t* axes);

// Appends the new keys and values to the KV cache of `layer`.
void add_attention(Plan& plan, const AttentionWeights& w, const AttentionParams& p, int layer,
                   ValueId x, ValueId y);

struct GatedDeltaNetWeights {
  MatrixRef in_proj_qkv;  // [2·Kd + Vd, H]: query, key and value channels
  MatrixRef in_proj_z;    // [Vd, H]: output gate
  MatrixRef in_proj_b;    // [Hv, H]: β before the sigmoid
  MatrixRef in_proj_a;    // [Hv, H]: decay input
  MatrixRef out_proj;     // [H, Vd]
  WeightVector conv;      // [channels, kernel] depthwise conv1d
  WeightVector a_log;     // [Hv]
  WeightVector dt_bias;   // [Hv]
  WeightVector norm;      // [v_dim], plain scale of the gated RMSNorm
};

struct GatedDeltaNetParams {
  DeltaRuleShape heads;
  int64_t conv_kernel = 4;
  float norm_eps = 1e-6f;
  // Prefill chunk of the delta rule (one token, or 0: the recurrent step over every row, each a
  // decode step's result to the bit).
  int64_t chunk = 64;

  int64_t key_width() const { return heads.n_k_heads * heads.k_dim; }
  int64_t value_width() const { return heads.n_v_heads * heads.v_dim; }
  int64_t conv_channels() const { return 2 * key_width() + value_width(); }
};

// Continues the conv and recurrent states of `layer`.
void add_gated_deltanet(Plan& plan, const GatedDeltaNetWeights& w, const GatedDeltaNetParams& p,
                        int layer, ValueId x, ValueId y);

struct MlpWeights {
  MatrixRef gate_proj, up_proj, down_proj;
};

void add_mlp(Plan& plan, const MlpWeights& w, ValueId x, ValueId y);

}  // namespace qhx
