#version 450
#extension GL_GOOGLE_include_directive : require
// One token's activations as two f16 parts, per block of 32 columns, for matmul_coopmat.comp's
// SPLIT_F16 form: x = s · (hi + lo / 2^10) with s = 2^(e - 15), e the least with every |x| of
// the block under 2^e, hi = f16(x / s) and lo = f16((x / s − hi) · 2^10). x / s is exact and
// under 2^15, as is its remainder after hi; lo, scaled up, stays clear of f16's subnormals (and
// under 2^15 whichever way the device rounds). So hi and lo keep x to 21 bits (22 where
// conversions round to nearest) down to 2^-17 of the block's largest |x|, and within 2^-28 of
// that largest below, even on a device that flushes f16 subnormals. An all-zero block gets s 0,
// a block holding inf or NaN s NaN, both with parts 0.
// A row's last block may be partial (columns a multiple of 4): its missing columns are 0. One
// thread per block; per block 16 words of hi, then 16 of lo (two halves a word, low first).
layout(local_size_x = 64) in;

layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) writeonly buffer Parts { uint parts[]; };
layout(std430, binding = 2) writeonly buffer S { float s[]; };
layout(push_constant) uniform Params {
  uint x_offset, cols, n_blocks;  // n_blocks = n_tokens · ⌈cols / 32⌉
} p;
#include "common.glsl"

void main() {
  const uint block = flat_group() * 64 + gl_LocalInvocationID.x;
  if (block >= p.n_blocks) return;
  const uint blocks_per_row = (p.cols + 31) / 32, first = (block % blocks_per_row) * 32;
  const uint base = p.x_offset + (block / blocks_per_row) * p.cols + first;
  const uint n = min(32, p.cols - first);
  float m = 0.0;
  bool finite = true;
  for (uint i = 0; i < n; ++i) {
    const float v = x[base + i];
    if (isnan(v) || isinf(v)) finite = false;
    m = max(m, abs(v));
  }
  if (!finite || m == 0.0) {
    s[block] = finite ? 0.0 : uintBitsToFloat(0x7FC00000u);
    for (uint i = 0; i < 32; ++i) parts[block * 32 + i] = 0u;
    return;
  }
  int e;
  frexp(m, e);  // m = f · 2^e, f in [0.5, 1)
  e = max(e, -100);  // ldexp's exponents stay in float's range: as if the largest were 2^-101
  s[block] = ldexp(1.0, e - 15);
  for (uint word = 0; word < 16; ++word) {
    const vec2 pair = word * 2 < n ? vec2(x[base + word * 2], x[base + word * 2 + 1]) : vec2(0.0);
    const vec2 v = ldexp(pair, ivec2(15 - e));
    const vec2 hi = unpackHalf2x16(packHalf2x16(v));
    parts[block * 32 + word] = packHalf2x16(hi);
    parts[block * 32 + 16 + word] = packHalf2x16((v - hi) * 1024.0);
  }
}
