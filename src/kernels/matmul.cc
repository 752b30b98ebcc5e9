#include "kernels/matmul.h"

#include "kernels/cpu_context.h"
#include "kernels/matmul_int8.h"
#include "kernels/token_blocks.h"

#if defined(__x86_64__)
#include <immintrin.h>

#include "kernels/simd_avx2.h"
#elif defined(__aarch64__)
#include "kernels/neon.h"
#endif

#include <algorithm>
#include <cmath>

namespace qhx {

#if defined(__x86_64__)
namespace {

#define QHX_AVX2 __attribute__((target("avx2,fma,f16c")))

using avx2::horizontal_sum;

// Eight weights of each dtype widened to f32 (W8/W4 as their integer values, scaled later).
QHX_AVX2 inline __m256 load8_f32(const float* p) {
  return _mm256_loadu_ps(p);
}
QHX_AVX2 inline __m256 load8_bf16(const uint16_t* p) {
  const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}
QHX_AVX2 inline __m256 load8_f16(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
QHX_AVX2 inline __m256 load8_i8(const int8_t* p) {
  return _mm256_cvtepi32_ps(
      _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}

// For each of NT tokens, out[t] = Σ x[t][c]·load(w, c) over n columns: four 8-wide accumulators,
// then 8 at a time, then scalar. The tokens share each weight load (prefill); every token's
// arithmetic is the same for any NT, so a token computed alone gets the same bits.
template <int NT, typename T, typename Load, typename Scalar>
QHX_AVX2 inline void dot(const T* w, const float* const* x, int64_t n, Load load, Scalar scalar,
                         float* out) {
  __m256 acc[NT][4];
  for (int t = 0; t < NT; ++t) {
    for (int k = 0; k < 4; ++k) acc[t][k] = _mm256_setzero_ps();
  }
  int64_t c = 0;
  for (; c + 32 <= n; c += 32) {
    for (int k = 0; k < 4; ++k) {
      const __m256 wk = load(w + c + 8 * k);
      for (int t = 0; t < NT; ++t) {
        acc[t][k] = _mm256_fmadd_ps(wk, _mm256_loadu_ps(x[t] + c + 8 * k), acc[t][k]);
      }
    }
  }
  for (; c + 8 <= n; c += 8) {
    const __m256 wk = load(w + c);
    for (int t = 0; t < NT; ++t) {
      acc[t][0] = _mm256_fmadd_ps(wk, _mm256_loadu_ps(x[t] + c), acc[t][0]);
    }
  }
  for (int t = 0; t < NT; ++t) {
    out[t] = horizontal_sum(
        _mm256_add_ps(_mm256_add_ps(acc[t][0], acc[t][1]), _mm256_add_ps(acc[t][2], acc[t][3])));
  }
  for (; c < n; ++c) {
    // Explicit fma: whether the compiler would contract a*b+c must not depend on NT.
    for (int t = 0; t < NT; ++t) out[t] = std::fma(scalar(w[c]), x[t][c], out[t]);
  }
}

// Sixteen int4 weights (8 packed bytes, low nibble first) as two vectors of 8 f32 values.
QHX_AVX2 inline void load16_i4(const uint8_t* p, __m256& first, __m256& second) {
  const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  const __m128i mask = _mm_set1_epi8(0x0F);
  const __m128i low = _mm_and_si128(bytes, mask);
  const __m128i high = _mm_and_si128(_mm_srli_epi16(bytes, 4), mask);
  __m128i q = _mm_unpacklo_epi8(low, high);  // column order
  const __m128i eight = _mm_set1_epi8(8);
  q = _mm_sub_epi8(_mm_xor_si128(q, eight), eight);  // sign-extend the nibbles
  first = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q));
  second = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(q, 8)));
}

// One W4 row for NT tokens: per group, Σ x·q in f32, then times the group's scale.
template <int NT>
QHX_AVX2 void dot_w4(const uint8_t* packed, const uint16_t* scales, int64_t group_size,
                     const float* const* x, int64_t n, float* out) {
  for (int t = 0; t < NT; ++t) out[t] = 0.0f;
  for (int64_t g = 0; g < n / group_size; ++g) {
    const int64_t begin = g * group_size;
    __m256 acc[NT][2];
    for (int t = 0; t < NT; ++t) acc[t][0] = acc[t][1] = _mm256_setzero_ps();
    int64_t c = begin;
    for (; c + 16 <= begin + group_size; c += 16) {
      __m256 first, second;
      load16_i4(packed + c / 2, first, second);
      for (int t = 0; t < NT; ++t) {
        acc[t][0] = _mm256_fmadd_ps(first, _mm256_loadu_ps(x[t] + c), acc[t][0]);
        acc[t][1] = _mm256_fmadd_ps(second, _mm256_loadu_ps(x[t] + c + 8), acc[t][1]);
      }
    }
    float group[NT];
    for (int t = 0; t < NT; ++t) group[t] = horizontal_sum(_mm256_add_ps(acc[t][0], acc[t][1]));
    for (; c < begin + group_size; ++c) {
      const int nibble = (packed[c / 2] >> (c % 2 * 4)) & 0xF;
      for (int t = 0; t < NT; ++t) {
        group[t] = std::fma(static_cast<float>((nibble ^ 8) - 8), x[t][c], group[t]);
      }
    }
    const float scale = f16_to_f32(scales[g]);
    for (int t = 0; t < NT; ++t) out[t] += scale * group[t];
  }
}

// Row r of w against NT tokens.
template <int NT>
QHX_AVX2 void dot_row(const MatrixRef& w, int64_t r, const float* const* x, float* out) {
  const int64_t n = w.cols;
  switch (w.dtype) {
    case DType::kF32:
      return dot<NT>(
          static_cast<const float*>(w.data) + r * n, x, n, load8_f32, [](float v) { return v; },
          out);
    case DType::kBF16:
      return dot<NT>(static_cast<const uint16_t*>(w.data) + r * n, x, n, load8_bf16, bf16_to_f32,
                     out);
    case DType::kF16:
      return dot<NT>(static_cast<const uint16_t*>(w.data) + r * n, x, n, load8_f16, f16_to_f32,
                     out);
    case DType::kW8: {
      dot<NT>(
          static_cast<const int8_t*>(w.data) + r * n, x, n, load8_i8,
          [](int8_t v) { return static_cast<float>(v); }, out);
      const float scale = static_cast<const float*>(w.scales)[r];
      for (int t = 0; t < NT; ++t) out[t] = scale * out[t];
      return;
    }
    case DType::kW4:
      return dot_w4<NT>(static_cast<const uint8_t*>(w.data) + r * n / 2,
                        static_cast<const uint16_t*>(w.scales) + r * (n / w.group_size),
                        w.group_size, x, n, out);
    default:
      std::abort();  // callers only build MatrixRefs of weight types
  }
}

}  // namespace

namespace simd {

QHX_AVX2 static void matmul_avx2(const float* x, int64_t n_tokens, const MatrixRef& w, float* y,
                                 int64_t row_begin, int64_t row_end) {
  // Two tokens per weight load: 8 accumulators each.
  rows_by_token_blocks<2>(
      x, n_tokens, w, y, row_begin, row_end,
      [&]<int NT>(int64_t r, const float* const* xs, float* out) { dot_row<NT>(w, r, xs, out); });
}

}  // namespace simd

void matmul(CpuContext& cx, const float* x, int64_t n_tokens, const MatrixRef& w, float* y) {
  if (uses_int8_activations(w)) return matmul_int8(cx, x, n_tokens, w, y);
  if (!cx.kernels().avx2) return ref::matmul(x, n_tokens, w, y);
  cx.split_rows(w.rows, 1, w.rows * w.cols * n_tokens, [&](int64_t begin, int64_t end) {
    simd::matmul_avx2(x, n_tokens, w, y, begin, end);
  });
}

#elif defined(__aarch64__)

void matmul(CpuContext& cx, const float* x, int64_t n_tokens, const MatrixRef& w, float* y) {
  if (uses_int8_activations(w)) return matmul_int8(cx, x, n_tokens, w, y);
  if (!cx.kernels().neon) return ref::matmul(x, n_tokens, w, y);
  cx.split_rows(w.rows, 1, w.rows * w.cols * n_tokens, [&](int64_t begin, int64_t end) {
    neon::matmul_rows(x, n_tokens, w, y, begin, end);
  });
}

#else  // no SIMD kernels for this architecture

void matmul(CpuContext& cx, const float* x, int64_t n_tokens, const MatrixRef& w, float* y) {
  if (uses_int8_activations(w)) return matmul_int8(cx, x, n_tokens, w, y);
  ref::matmul(x, n_tokens, w, y);
}

#endif

void matmul(CpuContext& cx, const float* x, int64_t n_tokens,
            std::initializer_list<MatmulOutput> outputs) {
  const std::span<const MatmulOutput> all(outputs.begin(), outputs.size());
  if (share_int8_activations(all)) return matmul_int8(cx, x, n_tokens, all);
  for (const MatmulOutput& o : all) matmul(cx, x, n_tokens, o.w, o.y);
}

}  // namespace qhx
