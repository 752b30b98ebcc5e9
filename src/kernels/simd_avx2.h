// AVX2 + FMA building blocks shared by the fast kernels, x86-64 only. Each function carries the
// target attribute itself: files that use them build for any x86-64 CPU and call them only after
// the context's CpuKernels::avx2 (kernels/cpu_context.h) said yes.
#pragma once

#if defined(__x86_64__)
#include <immintrin.h>

#include <cstdint>

#include "kernels/simd_exp.h"

#define QHX_TARGET_AVX2 __attribute__((target("avx2,fma")))

namespace qhx::avx2 {

QHX_TARGET_AVX2 inline float horizontal_sum(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 d = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(d, _mm_movehdup_ps(d)));
}

// The first n lanes (0 ≤ n ≤ 8): masked loads read zeros in the others, masked stores skip them.
QHX_TARGET_AVX2 inline __m256i first_lanes(int64_t n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)),
                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// e^x within 2 ulp (kernels/simd_exp.h), x clamped to [-87.33, 88].
QHX_TARGET_AVX2 inline __m256 exp(__m256 x) {
  using namespace cephes_exp;
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(kLowest)), _mm256_set1_ps(kHighest));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kLog2e)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2High), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Low), r);
  __m256 p = _mm256_set1_ps(kPolynomial[0]);
  for (int i = 1; i < 6; ++i) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kPolynomial[i]));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i two_to_n =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(two_to_n));
}

// One block of eight consecutive floats: FullBlock moves all eight, PartialBlock only the lanes
// of its mask, with the same arithmetic in between (see for_each_block).
struct FullBlock {
  QHX_TARGET_AVX2 __m256 load(const float* p) const { return _mm256_loadu_ps(p); }
  QHX_TARGET_AVX2 void store(float* p, __m256 v) const { _mm256_storeu_ps(p, v); }
};
struct PartialBlock {
  __m256i mask;
  QHX_TARGET_AVX2 __m256 load(const float* p) const { return _mm256_maskload_ps(p, mask); }
  QHX_TARGET_AVX2 void store(float* p, __m256 v) const { _mm256_maskstore_ps(p, mask, v); }
};

// Calls body(i, block) for i = 0, 8, 16, ... < n, where block.load(p) and block.store(p, v) move
// p[0, 8) clipped to the n − i elements left: the last, partial block runs the same code masked,
// so an element's result does not depend on where the array ends.
template <typename Body>
QHX_TARGET_AVX2 inline void for_each_block(int64_t n, Body body) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) body(i, FullBlock{});
  if (i < n) body(i, PartialBlock{first_lanes(n - i)});
}

}  // namespace qhx::avx2
#endif
