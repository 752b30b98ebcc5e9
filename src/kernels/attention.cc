#include "kernels/attention.h"

#if defined(__x86_64__)
#include <immintrin.h>
#elif defined(__aarch64__)
#include "kernels/neon.h"
#endif

#include <vector>

#include "kernels/matmul.h"
#include "kernels/thread_pool.h"

namespace qhx {
namespace {

#if defined(__x86_64__)
#define QHX_AVX2 __attribute__((target("avx2,fma")))

QHX_AVX2 float dot_avx2(const float* a, const float* b, int64_t n) {
  __m256 acc = _mm256_setzero_ps();
  for (int64_t d = 0; d < n; d += 8) {
    acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + d), _mm256_loadu_ps(b + d), acc);
  }
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
  const __m128 h = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
}

// out[0..n) += p · v[0..n)
QHX_AVX2 void axpy_avx2(float p, const float* v, float* out, int64_t n) {
  const __m256 pv = _mm256_set1_ps(p);
  for (int64_t d = 0; d < n; d += 8) {
    _mm256_storeu_ps(out + d,
                     _mm256_fmadd_ps(pv, _mm256_loadu_ps(v + d), _mm256_loadu_ps(out + d)));
  }
}

// One query row against its n_keys keys and values, head_dim a multiple of 8.
QHX_AVX2 void attend_one(const float* qh, int64_t n_keys, const float* keys, const float* values,
                         int64_t kv_stride, int64_t head_dim, float scale, float* scores,
                         float* oh) {
  for (int64_t j = 0; j < n_keys; ++j) {
    scores[j] = dot_avx2(qh, keys + j * kv_stride, head_dim) * scale;
  }
  ref::softmax(scores, n_keys);
  for (int64_t d = 0; d < head_dim; ++d) oh[d] = 0.0f;
  for (int64_t j = 0; j < n_keys; ++j) axpy_avx2(scores[j], values + j * kv_stride, oh, head_dim);
}
#endif

// One query head against its keys and values, as neon::attend_query in kernels/neon.h.
using AttendQuery = void (*)(const float* q, int64_t n_keys, const float* keys, const float* values,
                             int64_t kv_stride, int64_t head_dim, float scale, float* scores,
                             float* out);

// The SIMD kernel for this CPU and head size, or null for the reference.
AttendQuery fast_attend_query([[maybe_unused]] int64_t head_dim) {
#if defined(__x86_64__)
  if (simd::has_avx2() && head_dim % 8 == 0) return attend_one;
#elif defined(__aarch64__)
  if (neon::enabled() && head_dim % 4 == 0) return neon::attend_query;
#endif
  return nullptr;
}

}  // namespace

void causal_attention(const float* q, int64_t n_queries, int64_t first_pos, const float* keys,
                      const float* values, const AttentionShape& shape, float scale, float* out) {
  const int64_t hd = shape.head_dim;
  if (const AttendQuery attend = fast_attend_query(hd)) {
    const int64_t group = shape.n_heads / shape.n_kv_heads;
    const int64_t q_stride = shape.n_heads * hd;
    const int64_t kv_stride = shape.n_kv_heads * hd;
    kernel_pool().run(n_queries * shape.n_heads, [&](int64_t task) {
      const int64_t t = task / shape.n_heads, h = task % shape.n_heads;
      const int64_t n_keys = first_pos + t + 1;
      thread_local std::vector<float> scores;
      if (static_cast<int64_t>(scores.size()) < n_keys) scores.resize(n_keys);
      const int64_t kv_offset = (h / group) * hd;
      attend(q + t * q_stride + h * hd, n_keys, keys + kv_offset, values + kv_offset, kv_stride, hd,
             scale, scores.data(), out + t * q_stride + h * hd);
    });
    return;
  }
  std::vector<float> scores(first_pos + n_queries);
  ref::causal_attention(q, n_queries, first_pos, keys, values, shape, scale, out, scores.data());
}

}  // namespace qhx
