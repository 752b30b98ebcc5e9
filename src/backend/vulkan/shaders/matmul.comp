#version 450
#extension GL_GOOGLE_include_directive : require
// y[t, r] = Σ_c x[t, c] · w[r, c] with float32 activations, for one weight row per workgroup and
// up to TOKENS tokens: each weight element is read once for all of them. The sum runs over a
// strided share of the columns per thread, then a tree over the threads.
layout(local_size_x = 64) in;
#define TOKENS 8

layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer Weights { uint w[]; };
layout(std430, binding = 2) readonly buffer Scales { uint scales[]; };
layout(std430, binding = 3) writeonly buffer Y { float y[]; };
layout(push_constant) uniform Params {
  uint x_offset, y_offset, rows, cols, n_tokens, group_size;
} p;
#define COLS() p.cols
#define GROUP_SIZE() p.group_size
#include "common.glsl"
#include "weights.glsl"

shared float partial[TOKENS][64];

void main() {
  const uint row = flat_group();
  const uint t0 = gl_WorkGroupID.z * TOKENS;
  const uint lane = gl_LocalInvocationID.x;
  if (row >= p.rows) return;
  const uint n = min(TOKENS, p.n_tokens - t0);
  float acc[TOKENS];
  for (uint j = 0; j < TOKENS; ++j) acc[j] = 0.0;
  for (uint c = lane; c < p.cols; c += 64) {
    const float wc = weight_at(row, c);
    for (uint j = 0; j < n; ++j) acc[j] += wc * x[p.x_offset + (t0 + j) * p.cols + c];
  }
  for (uint j = 0; j < TOKENS; ++j) partial[j][lane] = acc[j];
  barrier();
  for (uint width = 32; width > 0; width >>= 1) {
    if (lane < width) {
      for (uint j = 0; j < TOKENS; ++j) partial[j][lane] += partial[j][lane + width];
    }
    barrier();
  }
  if (lane < n) y[p.y_offset + (t0 + lane) * p.rows + row] = partial[lane][0];
}
