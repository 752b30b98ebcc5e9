#version 450
#extension GL_GOOGLE_include_directive : require
// The gated delta rule token by token (ref::gated_delta_rule_recurrent), continuing the layer's
// recurrent state [n_v_heads, k_dim, v_dim]: per token and value head, S ← exp(g) S;
// S ← S + k (β (v − Sᵀk))ᵀ; o = Sᵀ q. Each thread owns one column of S (a value dimension), so
// a token needs no reduction across threads: only k and q are shared. One workgroup per
// (value head, 64 columns).
layout(local_size_x = 64) in;
#define MAX_K_DIM 128

layout(std430, binding = 0) buffer Arena { float a[]; };
layout(std430, binding = 1) buffer State { float state[]; };
layout(push_constant) uniform Params {
  uint q_offset, k_offset, v_offset, beta_offset, g_offset, out_offset;
  uint n_tokens, n_k_heads, n_v_heads, k_dim, v_dim;
} p;
#include "common.glsl"

shared float key[MAX_K_DIM];
shared float query[MAX_K_DIM];

void main() {
  const uint blocks = (p.v_dim + 63) / 64;
  const uint j = flat_group() / blocks;
  const uint col = (flat_group() % blocks) * 64 + gl_LocalInvocationID.x;
  const uint lane = gl_LocalInvocationID.x;
  const uint key_head = j / (p.n_v_heads / p.n_k_heads);
  const uint kd = p.k_dim, vd = p.v_dim;
  const bool owns = col < vd;
  float s[MAX_K_DIM];
  const uint state_base = j * kd * vd;
  for (uint i = 0; i < kd; ++i) s[i] = owns ? state[state_base + i * vd + col] : 0.0;
  for (uint t = 0; t < p.n_tokens; ++t) {
    barrier();
    for (uint i = lane; i < kd; i += 64) {
      key[i] = a[p.k_offset + t * p.n_k_heads * kd + key_head * kd + i];
      query[i] = a[p.q_offset + t * p.n_k_heads * kd + key_head * kd + i];
    }
    barrier();
    const float decay = exp(a[p.g_offset + t * p.n_v_heads + j]);
    const float beta = a[p.beta_offset + t * p.n_v_heads + j];
    float sk = 0.0;
    for (uint i = 0; i < kd; ++i) {
      s[i] *= decay;
      sk += s[i] * key[i];
    }
    const float v = owns ? a[p.v_offset + t * p.n_v_heads * vd + j * vd + col] : 0.0;
    const float delta = beta * (v - sk);
    float o = 0.0;
    for (uint i = 0; i < kd; ++i) {
      s[i] += key[i] * delta;
      o += s[i] * query[i];
    }
    if (owns) a[p.out_offset + t * p.n_v_heads * vd + j * vd + col] = o;
  }
  if (owns) {
    for (uint i = 0; i < kd; ++i) state[state_base + i * vd + col] = s[i];
  }
}
