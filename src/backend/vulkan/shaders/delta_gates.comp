#version 450
#extension GL_GOOGLE_include_directive : require
// In place, per token and value head: β = σ(b); g = −exp(a_log) · softplus(a + dt_bias) with
// softplus's threshold 20, as the CPU backend computes them.
layout(local_size_x = 64) in;

layout(std430, binding = 0) buffer Arena { float a[]; };
layout(std430, binding = 1) readonly buffer ALog { float a_log[]; };
layout(std430, binding = 2) readonly buffer DtBias { float dt_bias[]; };
layout(push_constant) uniform Params {
  uint beta_offset, g_offset, heads, n;
} p;
#include "common.glsl"

// log(1 + x) without losing the small x that 1 + x rounds away.
float log1p_accurate(float x) {
  const float u = 1.0 + x;
  return u == 1.0 ? x : log(u) * (x / (u - 1.0));
}

void main() {
  const uint i = flat_group() * 64 + gl_LocalInvocationID.x;
  if (i >= p.n) return;
  const uint j = i % p.heads;
  a[p.beta_offset + i] = 1.0 / (1.0 + exp(-a[p.beta_offset + i]));
  const float s = a[p.g_offset + i] + dt_bias[j];
  const float softplus = s > 20.0 ? s : log1p_accurate(exp(s));
  a[p.g_offset + i] = -exp(a_log[j]) * softplus;
}
