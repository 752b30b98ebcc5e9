#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_EXT_shader_explicit_arithmetic_types_int8 : require
// The prompt-sized form of matmul_q8.comp on cooperative matrices (tensor cores, matrix cores):
// y[t, r] = Σ_b sw(r, b) · sx(t, b) · Σ_{c ∈ b} qw[r, c] · qx[t, c], W8 (WEIGHT_W8) or W4
// (WEIGHT_W4) weights and activations quantized by quantize_q8. A workgroup computes BM weight
// rows × BN tokens: per block of 32 columns it stages the block's int8 weights and activations in
// shared memory with its scales, its subgroups multiply them in int8 × int8 → int32 matrices (the
// block's inner sums, exact), and every thread scales the sums of its elements by sw · sx in
// float and adds them up, block after block. The matrix sizes are the device's
// (VulkanDeviceInfo::int8_matrix, specialization constants 1-3); the shader works for any
// subgroup size dividing THREADS.
layout(local_size_x = 128) in;
const uint THREADS = 128, BM = 64, BN = 64;
layout(constant_id = 1) const uint TM = 16;  // rows of A and of the sums
layout(constant_id = 2) const uint TN = 16;  // columns of B and of the sums
layout(constant_id = 3) const uint TK = 32;  // columns of A, rows of B: divides 32
const uint TILES_N = BN / TN, TILES = (BM / TM) * TILES_N;

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

shared int8_t weights_block[BM * 32];  // [row][column of the block]: A, row-major
shared int8_t tokens_block[BN * 32];   // [token][column of the block]: B, column-major
shared int sums[BN * BM];              // [token][row]: the block's inner sums, column-major
// The block's sw and sx, two blocks' worth: a thread may stage block b + 1's while others still
// scale block b's sums.
shared float row_scales[2][BM], token_scales[2][BN];

// The four int8 values of word `word` (0..7) of block b of weight row `row`: W4 nibbles widened.
uint weight_bytes(uint row, uint b, uint word) {
#if defined(WEIGHT_W8)
  return w[p.w_base + (row * p.cols + b * 32) / 4 + word];
#else
  const uint nibbles = w[p.w_base + (row * p.cols + b * 32) / 8 + word / 2] >> (16u * (word & 1u));
  uint bytes = 0;
  for (uint k = 0; k < 4; ++k) bytes |= (uint(i4_at(nibbles, k)) & 0xFFu) << (8u * k);
  return bytes;
#endif
}

float weight_scale(uint row, uint b) {
#if defined(WEIGHT_W8)
  return uintBitsToFloat(scales[p.s_base + row]);
#else
  const uint group = row * (p.cols / p.group_size) + (b * 32) / p.group_size;
  return f16_at(scales[p.s_base + (group >> 1)], group & 1u);
#endif
}

void store_bytes(bool weights, uint at, uint bytes) {
  for (uint k = 0; k < 4; ++k) {
    const int8_t v = int8_t(bitfieldExtract(int(bytes), int(8u * k), 8));
    if (weights) {
      weights_block[at + k] = v;
    } else {
      tokens_block[at + k] = v;
    }
  }
}

void main() {
  const uint row0 = flat_group() * BM, t0 = gl_WorkGroupID.z * BN;
  const uint id = gl_LocalInvocationID.x;
  const uint blocks = p.cols / 32;
  // Thread `id` owns elements id + i · THREADS of the BM × BN tile, column-major: neighbouring
  // threads read neighbouring sums and write neighbouring outputs.
  const uint OWN = BM * BN / THREADS;
  float acc[OWN];
  for (uint i = 0; i < OWN; ++i) acc[i] = 0.0;
  for (uint b = 0; b < blocks; ++b) {
    for (uint i = id; i < BM * 8; i += THREADS) {
      const uint row = row0 + i / 8;
      store_bytes(true, i * 4, row < p.rows ? weight_bytes(row, b, i % 8) : 0u);
    }
    for (uint i = id; i < BN * 8; i += THREADS) {
      const uint t = t0 + i / 8;
      store_bytes(false, i * 4, t < p.n_tokens ? qx[(t * blocks + b) * 8 + i % 8] : 0u);
    }
    const uint slot = b & 1u;
    if (id < BM) {
      row_scales[slot][id] = row0 + id < p.rows ? weight_scale(row0 + id, b) : 0.0;
    } else if (id < BM + BN) {
      const uint t = t0 + id - BM;
      token_scales[slot][id - BM] = t < p.n_tokens ? sx[t * blocks + b] : 0.0;
    }
    barrier();
    for (uint tile = gl_SubgroupID; tile < TILES; tile += gl_NumSubgroups) {
      const uint tm = tile / TILES_N, tn = tile % TILES_N;
      coopmat<int, gl_ScopeSubgroup, TM, TN, gl_MatrixUseAccumulator> sum =
          coopmat<int, gl_ScopeSubgroup, TM, TN, gl_MatrixUseAccumulator>(0);
      for (uint k = 0; k < 32; k += TK) {
        coopmat<int8_t, gl_ScopeSubgroup, TM, TK, gl_MatrixUseA> a;
        coopmat<int8_t, gl_ScopeSubgroup, TK, TN, gl_MatrixUseB> x;
        coopMatLoad(a, weights_block, tm * TM * 32 + k, 32, gl_CooperativeMatrixLayoutRowMajor);
        coopMatLoad(x, tokens_block, tn * TN * 32 + k, 32, gl_CooperativeMatrixLayoutColumnMajor);
        sum = coopMatMulAdd(a, x, sum);
      }
      coopMatStore(sum, sums, tn * TN * BM + tm * TM, BM, gl_CooperativeMatrixLayoutColumnMajor);
    }
    barrier();
    for (uint i = 0; i < OWN; ++i) {
      const uint e = id + i * THREADS;
      acc[i] += row_scales[slot][e % BM] * token_scales[slot][e / BM] * float(sums[e]);
    }
  }
  for (uint i = 0; i < OWN; ++i) {
    const uint e = id + i * THREADS, row = row0 + e % BM, t = t0 + e / BM;
    if (row < p.rows && t < p.n_tokens) y[p.y_offset + t * p.y_stride + row] = acc[i];
  }
}
