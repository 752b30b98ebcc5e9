#version 450
#extension GL_GOOGLE_include_directive : require
// y[t, r] = Σ_b sw(r, b) · sx(t, b) · Σ_{c ∈ b} qw[r, c] · qx[t, c] for W8 (WEIGHT_W8) or W4
// (WEIGHT_W4) weights and activations quantized by quantize_q8 (ref::matmul's int8 form): the
// inner sums exact in integers. One weight row per workgroup, up to TOKENS tokens.
layout(local_size_x = 64) in;
#define TOKENS 8

layout(std430, binding = 0) readonly buffer Q { uint qx[]; };
layout(std430, binding = 1) readonly buffer S { float sx[]; };
layout(std430, binding = 2) readonly buffer Weights { uint w[]; };
layout(std430, binding = 3) readonly buffer Scales { uint scales[]; };
layout(std430, binding = 4) writeonly buffer Y { float y[]; };
layout(push_constant) uniform Params {
  uint y_offset, rows, cols, n_tokens, group_size;
} p;
#include "common.glsl"

shared float partial[TOKENS][64];

// Σ over the 32 columns of block b of row `row` times the token's quantized block.
int block_dot(uint row, uint b, uint token_block) {
  int sum = 0;
#if defined(WEIGHT_W8)
  const uint w_word = (row * p.cols + b * 32) / 4;
  for (uint i = 0; i < 8; ++i) {
    const uint a = w[w_word + i], v = qx[token_block * 8 + i];
    for (uint k = 0; k < 4; ++k) sum += i8_at(a, k) * i8_at(v, k);
  }
#else
  const uint w_word = (row * p.cols + b * 32) / 8;
  for (uint i = 0; i < 4; ++i) {
    const uint a = w[w_word + i];
    const uint v0 = qx[token_block * 8 + 2 * i], v1 = qx[token_block * 8 + 2 * i + 1];
    for (uint k = 0; k < 4; ++k) sum += i4_at(a, k) * i8_at(v0, k);
    for (uint k = 0; k < 4; ++k) sum += i4_at(a, k + 4) * i8_at(v1, k);
  }
#endif
  return sum;
}

float weight_scale(uint row, uint b) {
#if defined(WEIGHT_W8)
  return uintBitsToFloat(scales[row]);
#else
  const uint group = row * (p.cols / p.group_size) + (b * 32) / p.group_size;
  return f16_at(scales[group >> 1], group & 1u);
#endif
}

void main() {
  const uint row = flat_group();
  const uint t0 = gl_WorkGroupID.z * TOKENS;
  const uint lane = gl_LocalInvocationID.x;
  if (row >= p.rows) return;
  const uint n = min(TOKENS, p.n_tokens - t0);
  const uint blocks = p.cols / 32;
  float acc[TOKENS];
  for (uint j = 0; j < TOKENS; ++j) acc[j] = 0.0;
  for (uint b = lane; b < blocks; b += 64) {
    const float sw = weight_scale(row, b);
    for (uint j = 0; j < n; ++j) {
      const uint token_block = (t0 + j) * blocks + b;
      acc[j] += sw * sx[token_block] * float(block_dot(row, b, token_block));
    }
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
