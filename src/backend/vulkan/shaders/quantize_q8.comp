#version 450
#extension GL_GOOGLE_include_directive : require
// One token's activations as int8, per block of 32 columns, exactly as ref::quantize_activations:
// m = max|x|, scale = m / 127, q = roundEven(x · (127 / m)); an all-zero block gets scale 0 and
// q 0, a block holding inf or NaN scale NaN and q 0. One thread per block; q packed four per word.
layout(local_size_x = 64) in;

layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) writeonly buffer Q { uint q[]; };
layout(std430, binding = 2) writeonly buffer S { float s[]; };
layout(push_constant) uniform Params {
  uint x_offset, cols, n_blocks;  // n_blocks = n_tokens · cols / 32
} p;
#include "common.glsl"

void main() {
  const uint block = flat_group() * 64 + gl_LocalInvocationID.x;
  if (block >= p.n_blocks) return;
  const uint blocks_per_row = p.cols / 32;
  const uint base = p.x_offset + (block / blocks_per_row) * p.cols + (block % blocks_per_row) * 32;
  float m = 0.0;
  bool finite = true;
  for (uint i = 0; i < 32; ++i) {
    const float v = x[base + i];
    if (isnan(v) || isinf(v)) finite = false;
    m = max(m, abs(v));
  }
  if (!finite || m == 0.0) {
    s[block] = finite ? 0.0 : uintBitsToFloat(0x7FC00000u);
    for (uint i = 0; i < 8; ++i) q[block * 8 + i] = 0u;
    return;
  }
  s[block] = m / 127.0;
  const float inv = 127.0 / m;
  for (uint word = 0; word < 8; ++word) {
    uint packed = 0u;
    for (uint b = 0; b < 4; ++b) {
      const int v = int(roundEven(x[base + word * 4 + b] * inv));
      packed |= (uint(v) & 0xFFu) << (8u * b);
    }
    q[block * 8 + word] = packed;
  }
}
