// The NEON attention of one query head (kernels/neon.h).
#include <arm_neon.h>

#include "kernels/neon.h"

namespace qhx::neon {
namespace {

// Σ a·b over n, a multiple of 4: four accumulators over sixteen at a time, then four at a time.
float dot(const float* a, const float* b, int64_t n) {
  float32x4_t acc[4] = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)};
  int64_t d = 0;
  for (; d + 16 <= n; d += 16) {
    for (int k = 0; k < 4; ++k) {
      acc[k] = vfmaq_f32(acc[k], vld1q_f32(a + d + 4 * k), vld1q_f32(b + d + 4 * k));
    }
  }
  for (; d < n; d += 4) acc[0] = vfmaq_f32(acc[0], vld1q_f32(a + d), vld1q_f32(b + d));
  return vaddvq_f32(vaddq_f32(vaddq_f32(acc[0], acc[1]), vaddq_f32(acc[2], acc[3])));
}

// out[0..n) += p · v[0..n), n a multiple of 4.
void axpy(float p, const float* v, float* out, int64_t n) {
  for (int64_t d = 0; d < n; d += 4) {
    vst1q_f32(out + d, vfmaq_n_f32(vld1q_f32(out + d), vld1q_f32(v + d), p));
  }
}

}  // namespace

void attend_query(const float* q, int64_t n_keys, const float* keys, const float* values,
                  int64_t kv_stride, int64_t head_dim, float scale, float* scores, float* out) {
  for (int64_t j = 0; j < n_keys; ++j) scores[j] = dot(q, keys + j * kv_stride, head_dim) * scale;
  ref::softmax(scores, n_keys);
  for (int64_t d = 0; d < head_dim; ++d) out[d] = 0.0f;
  for (int64_t j = 0; j < n_keys; ++j) axpy(scores[j], values + j * kv_stride, out, head_dim);
}

}  // namespace qhx::neon
