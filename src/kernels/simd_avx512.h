// AVX-512 building blocks shared by the fast kernels, x86-64 only. Each function carries the
// target attribute itself: files that use them build for any x86-64 CPU and call them only after
// simd::has_avx512() (kernels/matmul.h) said yes.
#pragma once

#if defined(__x86_64__)
#include <immintrin.h>

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

}  // namespace qhx::avx512

#endif  // __x86_64__
