#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_shader_subgroup_basic : require
#if defined(SPLIT_F16)
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#else
#extension GL_EXT_shader_explicit_arithmetic_types_int8 : require
#endif
// Prompt-sized matmuls on cooperative matrices (tensor cores, matrix cores), in one of two forms:
// - int8 (default): y[t, r] = Σ_b sw(r, b) · sx(t, b) · Σ_{c ∈ b} qw[r, c] · qx[t, c], W8
//   (WEIGHT_W8) or W4 (WEIGHT_W4) weights and activations quantized by quantize_q8, in int8 × int8
//   → int32 matrices: the prompt form of matmul_q8.comp.
// - SPLIT_F16: the float32-activation matmul of matmul.comp for F16, BF16, W8 and W4 weights, in
//   f16 × f16 → f32 matrices without losing float32's precision. Every weight is held exactly in
//   f16: W8/W4's integers are, and F16's and BF16's values are after scaling each row's block by
//   a power of two that puts its largest value in [2^15, 2^16) (its sw; only values under 2^-29
//   of that largest may round, even on a device that flushes f16 subnormals). The activations
//   come from split_f16.comp as x = sx · (hi + lo / 2^10) with f16 hi and lo (21 to 22 of
//   float32's 24 bits): the products are exact, the matrices sum w · hi and w · lo in float32
//   apart, and the second joins the first scaled by 2^-10.
// A workgroup computes BM weight rows × BN tokens: per block of 32 columns it stages the block's
// weights and activations in shared memory with their scales, its subgroups multiply them in the
// device's matrix shape (VulkanDeviceInfo::int8_matrix, specialization constants 1-3, or
// f16_matrix, 4-6), and every thread scales the sums of its elements by sw · sx in float and adds
// them up, block after block. W4's groups of scales are whole blocks. In the SPLIT_F16 form a
// row's last block may be partial (columns a multiple of 4): its missing columns are 0. The
// shader works for any subgroup size dividing THREADS.
layout(local_size_x = 128) in;
const uint THREADS = 128, BM = 64, BN = 64;
#if defined(SPLIT_F16)
#define ELEMENT float16_t
#define SUM float
layout(constant_id = 4) const uint TM = 16;  // rows of A and of the sums
layout(constant_id = 5) const uint TN = 16;  // columns of B and of the sums
layout(constant_id = 6) const uint TK = 16;  // columns of A, rows of B: divides 32
const uint TOKEN_WORDS = 32;                 // a token's block: 16 words of hi, then 16 of lo
#else
#define ELEMENT int8_t
#define SUM int
layout(constant_id = 1) const uint TM = 16;
layout(constant_id = 2) const uint TN = 16;
layout(constant_id = 3) const uint TK = 32;
const uint TOKEN_WORDS = 8;  // a token's block: 32 int8
#endif
const uint TILES_N = BN / TN, TILES = (BM / TM) * TILES_N;

layout(std430, binding = 0) readonly buffer Tokens { uint tokens[]; };  // [token][block][word]
layout(std430, binding = 1) readonly buffer S { float sx[]; };          // [token][block]
layout(std430, binding = 2) readonly buffer Weights { uint w[]; };
layout(std430, binding = 3) readonly buffer Scales { uint scales[]; };
layout(std430, binding = 4) writeonly buffer Y { float y[]; };
layout(push_constant) uniform Params {
  uint y_offset, rows, cols, n_tokens, group_size;
  uint y_stride;  // floats per output row: all the matrix's rows, of which these are a part
  uint w_base, s_base;  // the words of w and scales before the matrix's first (weights.glsl)
} p;
#include "common.glsl"

shared ELEMENT weights_block[BM * 32];  // [row][column of the block]: A, row-major
#if defined(SPLIT_F16)
shared ELEMENT tokens_hi[BN * 32], tokens_lo[BN * 32];  // [token][column]: B, column-major
#else
shared ELEMENT tokens_block[BN * 32];
#endif
shared SUM sums[BN * BM];  // [token][row]: the block's inner sums, column-major
// The block's sw and sx, two blocks' worth: a thread may stage block b + 1's while others still
// scale block b's sums.
shared float row_scales[2][BM], token_scales[2][BN];
#if defined(SPLIT_F16) && (defined(WEIGHT_F16) || defined(WEIGHT_BF16))
#define SCALED_BLOCKS
shared uint half_row_exponent[THREADS];  // the largest biased exponent of a thread's half row
#endif

// Values 4 · quad .. 4 · quad + 3 of block b of weight row `row`: W8/W4's integers, F16's and
// BF16's values; 0 past the row's end.
vec4 weight_quad(uint row, uint b, uint quad) {
  if (b * 32 + quad * 4 >= p.cols) return vec4(0.0);
  const uint i = row * p.cols + b * 32 + quad * 4;  // a multiple of 4 (of 8 for W4's even quads)
#if defined(WEIGHT_W8)
  const uint word = w[p.w_base + i / 4];
  return vec4(i8_at(word, 0), i8_at(word, 1), i8_at(word, 2), i8_at(word, 3));
#elif defined(WEIGHT_W4)
  const uint word = w[p.w_base + i / 8], n = i % 8;
  return vec4(i4_at(word, n), i4_at(word, n + 1), i4_at(word, n + 2), i4_at(word, n + 3));
#elif defined(WEIGHT_F16)
  return vec4(unpackHalf2x16(w[p.w_base + i / 2]), unpackHalf2x16(w[p.w_base + i / 2 + 1]));
#elif defined(WEIGHT_BF16)
  const uint lo = w[p.w_base + i / 2], hi = w[p.w_base + i / 2 + 1];
  return vec4(bf16_at(lo, 0), bf16_at(lo, 1), bf16_at(hi, 0), bf16_at(hi, 1));
#else
#error "compile with one WEIGHT_* definition"
#endif
}

#if defined(SCALED_BLOCKS)
// F16's or BF16's block of a row (thread `id` holds half of it, its partner id ^ 1 the other)
// times 2^shift, its largest value in [2^15, 2^16), where f16 holds it exactly; its sw, 2^-shift.
// (The shift stops where ldexp's exponents leave float's range: a block of zeros.)
float scale_block(uint id, inout vec4 quads[4]) {
  uint exponent = 0;
  for (uint q = 0; q < 4; ++q) {
    for (uint k = 0; k < 4; ++k) {
      exponent = max(exponent, (floatBitsToUint(quads[q][k]) >> 23) & 0xFFu);
    }
  }
  half_row_exponent[id] = exponent;
  barrier();
  exponent = max(exponent, half_row_exponent[id ^ 1u]);
  const int shift = min(15 - (int(exponent) - 127), 126);
  for (uint q = 0; q < 4; ++q) quads[q] = ldexp(quads[q], ivec4(shift));
  return ldexp(1.0, -shift);
}
#else
// sw of block b of weight row `row`: W8's row scale, W4's group scale.
float weight_scale(uint row, uint b) {
#if defined(WEIGHT_W8)
  return uintBitsToFloat(scales[p.s_base + row]);
#else
  const uint group = row * (p.cols / p.group_size) + (b * 32) / p.group_size;
  return f16_at(scales[p.s_base + (group >> 1)], group & 1u);
#endif
}
#endif

// Block b of the workgroup's weight rows into weights_block and its sw into row_scales[slot]:
// thread `id` takes half a row, 16 values.
void stage_weights(uint id, uint row0, uint b, uint slot) {
  const uint r = id / 2, first_quad = (id % 2) * 4, row = row0 + r;
  vec4 quads[4];
  for (uint q = 0; q < 4; ++q) {
    quads[q] = row < p.rows ? weight_quad(row, b, first_quad + q) : vec4(0.0);
  }
#if defined(SCALED_BLOCKS)
  const float scale = scale_block(id, quads);
#else
  const float scale = row < p.rows ? weight_scale(row, b) : 0.0;
#endif
  for (uint q = 0; q < 4; ++q) {
    for (uint k = 0; k < 4; ++k) {
      weights_block[r * 32 + (first_quad + q) * 4 + k] = ELEMENT(quads[q][k]);
    }
  }
  if (id % 2 == 0) row_scales[slot][r] = row < p.rows ? scale : 0.0;
}

// Block b of the workgroup's tokens into the B arrays and its sx into token_scales[slot].
void stage_tokens(uint id, uint t0, uint b, uint blocks, uint slot) {
  for (uint i = id; i < BN * TOKEN_WORDS; i += THREADS) {
    const uint t = t0 + i / TOKEN_WORDS, word = i % TOKEN_WORDS;
    const uint bits = t < p.n_tokens ? tokens[(t * blocks + b) * TOKEN_WORDS + word] : 0u;
#if defined(SPLIT_F16)
    const f16vec2 pair = unpackFloat2x16(bits);  // the bits as they are: no conversion
    const uint at = (i / TOKEN_WORDS) * 32 + (word % 16) * 2;
    if (word < 16) {
      tokens_hi[at] = pair.x;
      tokens_hi[at + 1] = pair.y;
    } else {
      tokens_lo[at] = pair.x;
      tokens_lo[at + 1] = pair.y;
    }
#else
    for (uint k = 0; k < 4; ++k) tokens_block[i * 4 + k] = int8_t(i8_at(bits, k));
#endif
  }
  if (id < BN) {
    const uint t = t0 + id;
    token_scales[slot][id] = t < p.n_tokens ? sx[t * blocks + b] : 0.0;
  }
}

void main() {
  const uint row0 = flat_group() * BM, t0 = gl_WorkGroupID.z * BN;
  const uint id = gl_LocalInvocationID.x;
  const uint blocks = (p.cols + 31) / 32;
  // Thread `id` owns elements id + i · THREADS of the BM × BN tile, column-major: neighbouring
  // threads read neighbouring sums and write neighbouring outputs.
  const uint OWN = BM * BN / THREADS;
  float acc[OWN];
  for (uint i = 0; i < OWN; ++i) acc[i] = 0.0;
  for (uint b = 0; b < blocks; ++b) {
    const uint slot = b & 1u;
    stage_weights(id, row0, b, slot);
    stage_tokens(id, t0, b, blocks, slot);
    barrier();
    for (uint tile = gl_SubgroupID; tile < TILES; tile += gl_NumSubgroups) {
      const uint tm = tile / TILES_N, tn = tile % TILES_N;
      coopmat<SUM, gl_ScopeSubgroup, TM, TN, gl_MatrixUseAccumulator> sum =
          coopmat<SUM, gl_ScopeSubgroup, TM, TN, gl_MatrixUseAccumulator>(0);
#if defined(SPLIT_F16)
      coopmat<SUM, gl_ScopeSubgroup, TM, TN, gl_MatrixUseAccumulator> sum_lo =
          coopmat<SUM, gl_ScopeSubgroup, TM, TN, gl_MatrixUseAccumulator>(0);
#endif
      for (uint k = 0; k < 32; k += TK) {
        coopmat<ELEMENT, gl_ScopeSubgroup, TM, TK, gl_MatrixUseA> a;
        coopmat<ELEMENT, gl_ScopeSubgroup, TK, TN, gl_MatrixUseB> x;
        coopMatLoad(a, weights_block, tm * TM * 32 + k, 32, gl_CooperativeMatrixLayoutRowMajor);
#if defined(SPLIT_F16)
        coopMatLoad(x, tokens_lo, tn * TN * 32 + k, 32, gl_CooperativeMatrixLayoutColumnMajor);
        sum_lo = coopMatMulAdd(a, x, sum_lo);
        coopMatLoad(x, tokens_hi, tn * TN * 32 + k, 32, gl_CooperativeMatrixLayoutColumnMajor);
#else
        coopMatLoad(x, tokens_block, tn * TN * 32 + k, 32, gl_CooperativeMatrixLayoutColumnMajor);
#endif
        sum = coopMatMulAdd(a, x, sum);
      }
#if defined(SPLIT_F16)
      sum += sum_lo * (1.0 / 1024.0);
#endif
      coopMatStore(sum, sums, tn * TN * BM + tm * TM, BM, gl_CooperativeMatrixLayoutColumnMajor);
    }
    barrier();
    for (uint i = 0; i < OWN; ++i) {
      const uint e = id + i * THREADS;
      // (sw · Σ first: the weights' true sizes, which a product of the two scales may leave.)
      acc[i] += row_scales[slot][e % BM] * float(sums[e]) * token_scales[slot][e / BM];
    }
  }
  for (uint i = 0; i < OWN; ++i) {
    const uint e = id + i * THREADS, row = row0 + e % BM, t = t0 + e / BM;
    if (row < p.rows && t < p.n_tokens) y[p.y_offset + t * p.y_stride + row] = acc[i];
  }
}
