#version 450
#extension GL_GOOGLE_include_directive : require
// out[t, c] = w[ids[t], c] as float32 (ref::read_row), one thread per element, for the tokens
// whose row is in this part of the matrix (rows first_row.. of it; the host splits large ones).
layout(local_size_x = 64) in;

layout(std430, binding = 0) readonly buffer Ids { int ids[]; };
layout(std430, binding = 1) readonly buffer Weights { uint w[]; };
layout(std430, binding = 2) readonly buffer Scales { uint scales[]; };
layout(std430, binding = 3) writeonly buffer Out { float out_values[]; };
layout(push_constant) uniform Params {
  uint ids_offset, out_offset, cols, n_tokens, group_size, first_row, rows, w_base, s_base;
} p;
#define COLS() p.cols
#define GROUP_SIZE() p.group_size
#define W_BASE() p.w_base
#define S_BASE() p.s_base
#include "common.glsl"
#include "weights.glsl"

void main() {
  const uint i = flat_group() * 64 + gl_LocalInvocationID.x;
  if (i >= p.n_tokens * p.cols) return;
  const uint t = i / p.cols, c = i % p.cols;
  const int row = ids[p.ids_offset + t] - int(p.first_row);
  if (row < 0 || row >= int(p.rows)) return;
  out_values[p.out_offset + i] = weight_at(uint(row), c);
}
