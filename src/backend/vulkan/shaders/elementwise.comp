#version 450
#extension GL_GOOGLE_include_directive : require
// One thread per element of the arena, for the op the shader is compiled for:
//   ADD:          out[i] += in[i]
//   SIGMOID_GATE: out[i] *= sigmoid(in[i])
//   SILU_MUL:     out[i] = silu(in[i]) · in2[i]  (out may be in)
//   PERTURB:      out[i] = out[i] / 2 + 1/4 (a test switch: VulkanBackendOptions::perturb_op)
// as the ref:: definitions compute them.
layout(local_size_x = 64) in;

layout(std430, binding = 0) buffer Arena { float a[]; };
layout(push_constant) uniform Params {
  uint in_offset, in2_offset, out_offset, n;
} p;
#include "common.glsl"

void main() {
  const uint i = flat_group() * 64 + gl_LocalInvocationID.x;
  if (i >= p.n) return;
  const float x = a[p.in_offset + i];
#if defined(ADD)
  a[p.out_offset + i] += x;
#elif defined(SIGMOID_GATE)
  a[p.out_offset + i] *= 1.0 / (1.0 + exp(-x));
#elif defined(SILU_MUL)
  a[p.out_offset + i] = x / (1.0 + exp(-x)) * a[p.in2_offset + i];
#elif defined(PERTURB)
  a[p.out_offset + i] = x * 0.5 + 0.25;  // a wrong answer, for the device check's test
#else
#error "compile with one op definition"
#endif
}
