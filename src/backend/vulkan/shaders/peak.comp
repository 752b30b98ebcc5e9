#version 450
#extension GL_GOOGLE_include_directive : require
#if defined(DOT)
#include "int8_dot.glsl"
#endif
#if defined(INT8_MATRIX) || defined(F16_MATRIX)
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_shader_subgroup_basic : require
#if defined(F16_MATRIX)
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#else
#extension GL_EXT_shader_explicit_arithmetic_types_int8 : require
#endif
#endif
// What the device reaches at best (VulkanBackend::measure_peaks), one form per definition:
// - READ: the threads stream a buffer of uvec4, each its strided share: bytes read per second.
// - FMA: LOOPS rounds of 8 independent vec4 multiply-adds a thread (64 operations a round).
// - DOT: LOOPS rounds of 8 independent int8 dot products with accumulation (dot4x8 + add: 8
//   operations each) a thread.
// - INT8_MATRIX, F16_MATRIX: MATRIX_LOOPS rounds of 4 independent cooperative-matrix products
//   with accumulation a subgroup, in the device's shape for matmul_coopmat.comp (its
//   specialization constants): 2·M·N·K operations each.
// Every thread (subgroup) writes its result, so that no loop can be left out; the writes
// wrap around a buffer of mask + 1 words.
layout(local_size_x = 64) in;
const uint LOOPS = 1024, MATRIX_LOOPS = 256;

#if defined(READ)
layout(std430, binding = 0) readonly buffer Data { uvec4 data[]; };
layout(std430, binding = 1) writeonly buffer Out { uint out_words[]; };
layout(push_constant) uniform Params { uint vectors, mask; } p;
#else
layout(push_constant) uniform Params { uint mask; } p;
#endif
#if defined(FMA) || defined(DOT)
layout(std430, binding = 0) writeonly buffer Out { uint out_words[]; };
#endif

#if defined(INT8_MATRIX) || defined(F16_MATRIX)
#if defined(F16_MATRIX)
#define ELEMENT float16_t
#define SUM float
layout(constant_id = 4) const uint TM = 16;
layout(constant_id = 5) const uint TN = 16;
layout(constant_id = 6) const uint TK = 16;
#else
#define ELEMENT int8_t
#define SUM int
layout(constant_id = 1) const uint TM = 16;
layout(constant_id = 2) const uint TN = 16;
layout(constant_id = 3) const uint TK = 32;
#endif
layout(std430, binding = 0) writeonly buffer Out { SUM sums[]; };
shared ELEMENT a_tile[TM * TK], b_tile[TK * TN];
#define MATRIX(use, rows, cols) coopmat<ELEMENT, gl_ScopeSubgroup, rows, cols, use>
#define ACCUMULATOR coopmat<SUM, gl_ScopeSubgroup, TM, TN, gl_MatrixUseAccumulator>
#endif

#include "common.glsl"

void main() {
  const uint thread = flat_group() * 64 + gl_LocalInvocationID.x;
#if defined(READ)
  const uint stride = gl_NumWorkGroups.x * gl_NumWorkGroups.y * 64;
  uvec4 acc = uvec4(0);
  for (uint i = thread; i < p.vectors; i += stride) acc ^= data[i];
  out_words[thread & p.mask] = acc.x ^ acc.y ^ acc.z ^ acc.w;
#elif defined(FMA)
  vec4 c[8];
  for (uint k = 0; k < 8; ++k) c[k] = vec4(float(thread + k) * 1e-6);
  const vec4 m = vec4(0.999), add = vec4(1e-3);  // converges: no overflow, no subnormals
  for (uint i = 0; i < LOOPS; ++i) {
    for (uint k = 0; k < 8; ++k) c[k] = fma(c[k], m, add);
  }
  vec4 sum = vec4(0.0);
  for (uint k = 0; k < 8; ++k) sum += c[k];
  out_words[thread & p.mask] = floatBitsToUint(sum.x + sum.y + sum.z + sum.w);
#elif defined(DOT)
  int c[8];
  for (uint k = 0; k < 8; ++k) c[k] = int(thread * 2654435761u + k);
  const int b = int(0x01020304u ^ thread);
  for (uint i = 0; i < LOOPS; ++i) {
    for (uint k = 0; k < 8; ++k) c[k] = dot4x8(c[k], b) + c[k];
  }
  int sum = 0;
  for (uint k = 0; k < 8; ++k) sum ^= c[k];
  out_words[thread & p.mask] = uint(sum);
#else
  const uint id = gl_LocalInvocationID.x;
  for (uint i = id; i < TM * TK; i += 64) a_tile[i] = ELEMENT((i + thread) % 3);
  for (uint i = id; i < TK * TN; i += 64) b_tile[i] = ELEMENT(i % 5);
  barrier();
  MATRIX(gl_MatrixUseA, TM, TK) a;
  MATRIX(gl_MatrixUseB, TK, TN) b;
  coopMatLoad(a, a_tile, 0, TK, gl_CooperativeMatrixLayoutRowMajor);
  coopMatLoad(b, b_tile, 0, TN, gl_CooperativeMatrixLayoutRowMajor);
  ACCUMULATOR c0 = ACCUMULATOR(0), c1 = ACCUMULATOR(1), c2 = ACCUMULATOR(2), c3 = ACCUMULATOR(3);
  for (uint i = 0; i < MATRIX_LOOPS; ++i) {
    c0 = coopMatMulAdd(a, b, c0);
    c1 = coopMatMulAdd(a, b, c1);
    c2 = coopMatMulAdd(a, b, c2);
    c3 = coopMatMulAdd(a, b, c3);
  }
  c0 = c0 + c1 + c2 + c3;
  const uint subgroup = flat_group() * gl_NumSubgroups + gl_SubgroupID;
  // (256 tiles of at most 64 × 64 sums fit the buffer's 2^20 words)
  coopMatStore(c0, sums, (subgroup & 255u) * TM * TN, TN, gl_CooperativeMatrixLayoutRowMajor);
#endif
}
