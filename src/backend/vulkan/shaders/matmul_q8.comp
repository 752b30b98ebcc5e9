#version 450
#extension GL_GOOGLE_include_directive : require
#if defined(INT8_DOT)
#include "int8_dot.glsl"
#endif
// y[t, r] = Σ_b sw(r, b) · sx(t, b) · Σ_{c ∈ b} qw[r, c] · qx[t, c] for W8 (WEIGHT_W8) or W4
// (WEIGHT_W4) weights and activations quantized by quantize_q8 (ref::matmul's int8 form): the
// inner sums exact in integers. ROWS weight rows per workgroup (LANES threads each), up to TOKENS tokens.
layout(local_size_x = 64) in;
#define TOKENS 8
// Threads per weight row, chosen per device when the pipeline is created (VulkanDevice::
// matmul_lanes): 16 on GPUs (a row's reads coalesce), 1 on CPU-type devices, where a barrier
// costs more than a thread's longer loop.
layout(constant_id = 0) const uint LANES = 16;
const uint ROWS = 64 / LANES;

layout(std430, binding = 0) readonly buffer Q { uint qx[]; };
layout(std430, binding = 1) readonly buffer S { float sx[]; };
layout(std430, binding = 2) readonly buffer Weights { uint w[]; };
layout(std430, binding = 3) readonly buffer Scales { uint scales[]; };
layout(std430, binding = 4) writeonly buffer Y { float y[]; };
layout(push_constant) uniform Params {
  uint y_offset, rows, cols, n_tokens, group_size;
  uint y_stride;  // floats per output row: all the matrix's rows, of which these are a part
  uint w_base, s_base;  // the words of w and scales before the matrix's first (weights.glsl)
} p;
#include "common.glsl"

shared float partial[TOKENS][64];  // [token][row team · LANES + lane]

// Σ over the 32 columns of block b of row `row` times the token's quantized block. With INT8_DOT
// (devices with shaderIntegerDotProduct) four products per instruction; W4 nibbles are
// spread to bytes first, as n ^ 8 (0..15) whose sum is corrected by 8 · Σ activations.
int block_dot(uint row, uint b, uint token_block) {
  int sum = 0;
#if defined(WEIGHT_W8)
  const uint w_word = p.w_base + (row * p.cols + b * 32) / 4;
  for (uint i = 0; i < 8; ++i) {
    const uint a = w[w_word + i], v = qx[token_block * 8 + i];
#if defined(INT8_DOT)
    sum += dot4x8(int(a), int(v));
#else
    for (uint k = 0; k < 4; ++k) sum += i8_at(a, k) * i8_at(v, k);
#endif
  }
#else
  const uint w_word = p.w_base + (row * p.cols + b * 32) / 8;
  for (uint i = 0; i < 4; ++i) {
    const uint a = w[w_word + i];
    const uint v0 = qx[token_block * 8 + 2 * i], v1 = qx[token_block * 8 + 2 * i + 1];
#if defined(INT8_DOT)
    const uint low = (a & 0xFu) | ((a & 0xF0u) << 4) | ((a & 0xF00u) << 8) | ((a & 0xF000u) << 12);
    const uint high = ((a >> 16) & 0xFu) | ((a >> 12) & 0xF00u) | ((a >> 8) & 0xF0000u) |
                      ((a >> 4) & 0xF000000u);
    const int ones = 0x01010101;
    sum += dot4x8(int(low ^ 0x08080808u), int(v0)) +
           dot4x8(int(high ^ 0x08080808u), int(v1)) -
           8 * (dot4x8(ones, int(v0)) + dot4x8(ones, int(v1)));
#else
    for (uint k = 0; k < 4; ++k) sum += i4_at(a, k) * i8_at(v0, k);
    for (uint k = 0; k < 4; ++k) sum += i4_at(a, k + 4) * i8_at(v1, k);
#endif
  }
#endif
  return sum;
}

float weight_scale(uint row, uint b) {
#if defined(WEIGHT_W8)
  return uintBitsToFloat(scales[p.s_base + row]);
#else
  const uint group = row * (p.cols / p.group_size) + (b * 32) / p.group_size;
  return f16_at(scales[p.s_base + (group >> 1)], group & 1u);
#endif
}

void main() {
  const uint team = gl_LocalInvocationID.x / LANES, lane = gl_LocalInvocationID.x % LANES;
  const uint row = flat_group() * ROWS + team;
  const uint t0 = gl_WorkGroupID.z * TOKENS;
  const bool owns = row < p.rows;
  const uint n = min(TOKENS, p.n_tokens - t0);
  const uint blocks = p.cols / 32;
  float acc[TOKENS];
  for (uint j = 0; j < TOKENS; ++j) acc[j] = 0.0;
  for (uint b = lane; owns && b < blocks; b += LANES) {
    const float sw = weight_scale(row, b);
    for (uint j = 0; j < n; ++j) {
      const uint token_block = (t0 + j) * blocks + b;
      acc[j] += sw * sx[token_block] * float(block_dot(row, b, token_block));
    }
  }
  const uint slot = team * LANES + lane;
  for (uint j = 0; j < TOKENS; ++j) partial[j][slot] = acc[j];
  barrier();
  for (uint width = LANES / 2; width > 0; width >>= 1) {
    if (lane < width) {
      for (uint j = 0; j < TOKENS; ++j) partial[j][slot] += partial[j][slot + width];
    }
    barrier();
  }
  for (uint j = lane; owns && j < n; j += LANES) {
    y[p.y_offset + (t0 + j) * p.y_stride + row] = partial[j][team * LANES];
  }
}
