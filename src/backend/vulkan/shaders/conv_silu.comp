#version 450
#extension GL_GOOGLE_include_directive : require
// Depthwise causal conv1d over time then SiLU (ref::causal_conv1d_silu), continuing the layer's
// conv state [kernel-1, channels], which it updates. One thread per channel walks the tokens.
layout(local_size_x = 64) in;
#define MAX_KERNEL 8

layout(std430, binding = 0) buffer Arena { float a[]; };
layout(std430, binding = 1) readonly buffer Weight { float weight[]; };  // [channels, kernel]
layout(std430, binding = 2) buffer State { float state[]; };
layout(push_constant) uniform Params {
  uint in_offset, out_offset, channels, kernel, n_tokens;
} p;
#include "common.glsl"

void main() {
  const uint c = flat_group() * 64 + gl_LocalInvocationID.x;
  if (c >= p.channels) return;
  const uint history = p.kernel - 1;
  float window[MAX_KERNEL];  // oldest first; window[history] is the current token
  for (uint j = 0; j < history; ++j) window[j] = state[j * p.channels + c];
  for (uint t = 0; t < p.n_tokens; ++t) {
    window[history] = a[p.in_offset + t * p.channels + c];
    float acc = 0.0;
    for (uint j = 0; j < p.kernel; ++j) acc += weight[c * p.kernel + j] * window[j];
    a[p.out_offset + t * p.channels + c] = acc / (1.0 + exp(-acc));
    for (uint j = 0; j < history; ++j) window[j] = window[j + 1];
  }
  for (uint j = 0; j < history; ++j) state[j * p.channels + c] = window[j];
}
