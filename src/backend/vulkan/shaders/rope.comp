#version 450
#extension GL_GOOGLE_include_directive : require
// In place, rotate-half RoPE (ref::rope_rotate_half) of every `width`-element head of each row on
// its first rotary_dim elements. The angles' cos and sin come from the host ([rows, rotary/2]
// each, as transformers computes them in f32): a GPU's cos of a large angle is not that exact.
// One thread per rotated pair.
layout(local_size_x = 64) in;

layout(std430, binding = 0) buffer Arena { float a[]; };
layout(std430, binding = 1) readonly buffer Table { float table[]; };  // cos rows, then sin rows
layout(push_constant) uniform Params {
  uint offset, cols, width, half_rotary, table_offset, rows;
} p;
#include "common.glsl"

void main() {
  const uint i = flat_group() * 64 + gl_LocalInvocationID.x;
  const uint heads = p.cols / p.width;
  if (i >= p.rows * heads * p.half_rotary) return;
  const uint k = i % p.half_rotary, head = (i / p.half_rotary) % heads;
  const uint t = i / (p.half_rotary * heads);
  const uint first = p.offset + t * p.cols + head * p.width + k;
  const float c = table[p.table_offset + t * p.half_rotary + k];
  const float s = table[p.table_offset + (p.rows + t) * p.half_rotary + k];
  const float x1 = a[first], x2 = a[first + p.half_rotary];
  a[first] = x1 * c - x2 * s;
  a[first + p.half_rotary] = x2 * c + x1 * s;
}
