// AVX-512 building blocks shared by the fast kernels, x86-64 only. Each function carries the
// target attribute itself: files that use them build for any x86-64 CPU and call them only after
// the context's CpuKernels::avx512 (kernels/cpu_context.h) said yes.
#pragma once

#if defined(__x86_64__)
#include <immintrin.h>

#include <cstdint>

#include "kernels/simd_exp.h"

#define QHX_TARGET_AVX512 __attribute__((target("avx512f")))

namespace qhx::avx512 {

// The lanes of a and b regrouped for a tree over sixteen vectors: `even` holds lanes 0, 2, ..., 14
// of a then of b, `odd` lanes 1, 3, ..., 15. Combining the two (add: sums, max: maxima) halves
// each vector's lanes and packs two vectors into one; four rounds over sixteen vectors, pairing
// neighbours, leave vector j's total in lane j, always in the same order.
struct LanePairs {
  __m512 even, odd;
};
QHX_TARGET_AVX512 inline LanePairs lane_pairs(__m512 a, __m512 b) {
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
  return {_mm512_permutex2var_ps(a, even, b), _mm512_permutex2var_ps(a, odd, b)};
}

// The sum (kMax false) or the maximum (kMax true) of v's sixteen lanes, halves first. (GCC 12's
// _mm512_reduce_* and 512-bit shuffles of v with itself warn of uninitialised values.)
template <bool kMax>
QHX_TARGET_AVX512 inline float horizontal(__m512 v) {
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, v);
  const __m256 a = _mm256_load_ps(lanes), b = _mm256_load_ps(lanes + 8);
  const __m256 c = kMax ? _mm256_max_ps(a, b) : _mm256_add_ps(a, b);
  const __m128 lo = _mm256_castps256_ps128(c), hi = _mm256_extractf128_ps(c, 1);
  __m128 d = kMax ? _mm_max_ps(lo, hi) : _mm_add_ps(lo, hi);
  d = kMax ? _mm_max_ps(d, _mm_movehl_ps(d, d)) : _mm_add_ps(d, _mm_movehl_ps(d, d));
  d = kMax ? _mm_max_ss(d, _mm_movehdup_ps(d)) : _mm_add_ss(d, _mm_movehdup_ps(d));
  return _mm_cvtss_f32(d);
}

// The first n lanes, none for n ≤ 0 and all sixteen for n ≥ 16: masked loads read zeros in the
// others, masked stores skip them.
QHX_TARGET_AVX512 inline __mmask16 first_lanes(int64_t n) {
  if (n <= 0) return 0;
  return n >= 16 ? __mmask16{0xFFFF} : static_cast<__mmask16>((1u << n) - 1);
}

// GCC 12's AVX-512 intrinsics start from _mm512_undefined_*(), which its own -Wmaybe-uninitialized
// reports wherever this is inlined (GCC bug 105593).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
// avx2::exp in sixteen lanes: the same operations on each, so the same bits.
QHX_TARGET_AVX512 inline __m512 exp(__m512 x) {
  using namespace cephes_exp;
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(kLowest)), _mm512_set1_ps(kHighest));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(kLog2e)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2High), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Low), r);
  __m512 p = _mm512_set1_ps(kPolynomial[0]);
  for (int i = 1; i < 6; ++i) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kPolynomial[i]));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  const __m512i two_to_n =
      _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(p, _mm512_castsi512_ps(two_to_n));
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

}  // namespace qhx::avx512

#endif  // __x86_64__
