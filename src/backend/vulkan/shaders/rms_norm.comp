#version 450
#extension GL_GOOGLE_include_directive : require
#include "reduce.glsl"
// Each `width` elements of the input: y = weight ⊙ (x / sqrt(mean(x²) + eps)) (ref::rms_norm),
// one vector per workgroup; the input may be the output. With L2 defined: x / sqrt(Σx² + eps)
// × scale, no weight (the Gated DeltaNet's q/k norm, ref::l2_normalize).
layout(local_size_x = 64) in;

layout(std430, binding = 0) buffer Arena { float a[]; };
layout(std430, binding = 1) readonly buffer Weight { float weight[]; };
layout(push_constant) uniform Params {
  uint in_offset, out_offset, width, n_vectors;
  float eps, scale;
} p;
#include "common.glsl"

void main() {
  const uint v = flat_group();
  if (v >= p.n_vectors) return;
  const uint lane = gl_LocalInvocationID.x;
  const uint in_base = p.in_offset + v * p.width, out_base = p.out_offset + v * p.width;
  float sum = 0.0;
  for (uint i = lane; i < p.width; i += 64) sum += a[in_base + i] * a[in_base + i];
  const float total = workgroup_sum(sum);
#if defined(L2)
  const float inv = 1.0 / sqrt(total + p.eps);
  for (uint i = lane; i < p.width; i += 64) a[out_base + i] = a[in_base + i] * inv * p.scale;
#else
  const float inv = 1.0 / sqrt(total / float(p.width) + p.eps);
  for (uint i = lane; i < p.width; i += 64) {
    a[out_base + i] = weight[i] * (a[in_base + i] * inv);
  }
#endif
}
