#version 450
#extension GL_GOOGLE_include_directive : require
// y[t, r] = Σ_c x[t, c] · w[r, c] with float32 activations, for ROWS weight rows per workgroup
// (LANES threads each) and up to TOKENS tokens: each weight element is read once for all of them.
// The sum runs over a strided share of the columns per thread, then a tree over a row's lanes.
layout(local_size_x = 64) in;
#define TOKENS 8
// Threads per weight row, chosen per device when the pipeline is created (VulkanDevice::
// matmul_lanes): 16 on GPUs (a row's reads coalesce), 1 on CPU-type devices, where a barrier
// costs more than a thread's longer loop.
layout(constant_id = 0) const uint LANES = 16;
const uint ROWS = 64 / LANES;

layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer Weights { uint w[]; };
layout(std430, binding = 2) readonly buffer Scales { uint scales[]; };
layout(std430, binding = 3) writeonly buffer Y { float y[]; };
layout(push_constant) uniform Params {
  uint x_offset, y_offset, rows, cols, n_tokens, group_size;
  uint y_stride;  // floats per output row: all the matrix's rows, of which these are a part
  uint w_base, s_base;
} p;
#define COLS() p.cols
#define GROUP_SIZE() p.group_size
#define W_BASE() p.w_base
#define S_BASE() p.s_base
#include "common.glsl"
#include "weights.glsl"

shared float partial[TOKENS][64];  // [token][row team · LANES + lane]

void main() {
  const uint team = gl_LocalInvocationID.x / LANES, lane = gl_LocalInvocationID.x % LANES;
  const uint row = flat_group() * ROWS + team;
  const uint t0 = gl_WorkGroupID.z * TOKENS;
  const bool owns = row < p.rows;
  const uint n = min(TOKENS, p.n_tokens - t0);
  float acc[TOKENS];
  for (uint j = 0; j < TOKENS; ++j) acc[j] = 0.0;
  for (uint c = lane; owns && c < p.cols; c += LANES) {
    const float wc = weight_at(row, c);
    for (uint j = 0; j < n; ++j) acc[j] += wc * x[p.x_offset + (t0 + j) * p.cols + c];
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
