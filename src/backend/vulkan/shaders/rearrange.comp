#version 450
#extension GL_GOOGLE_include_directive : require
// Moves columns of [rows, cols] values, one thread per output element:
//   COPY_COLUMNS: out[t, j] = in[t, offset + j]       (out: [rows, width])
//   SPLIT_HEADS:  in [rows, heads·2·width] as [query | gate] per head → out, out2 [rows, heads·width]
layout(local_size_x = 64) in;

layout(std430, binding = 0) buffer Arena { float a[]; };
layout(push_constant) uniform Params {
  uint in_offset, out_offset, out2_offset, in_cols, out_cols, width, column_offset, n;
} p;
#include "common.glsl"

void main() {
  const uint i = flat_group() * 64 + gl_LocalInvocationID.x;
  if (i >= p.n) return;
  const uint t = i / p.out_cols, j = i % p.out_cols;
#if defined(COPY_COLUMNS)
  a[p.out_offset + i] = a[p.in_offset + t * p.in_cols + p.column_offset + j];
#else
  const uint head = j / p.width, d = j % p.width;
  const uint from = p.in_offset + t * p.in_cols + head * 2 * p.width + d;
  a[p.out_offset + i] = a[from];
  a[p.out2_offset + i] = a[from + p.width];
#endif
}
