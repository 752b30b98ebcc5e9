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

// A head of type kv as float32 into row[head_dim] (kv_load_head's values, from the same
// float32 products).
void widen_head(KvType kv, const float* head, int64_t head_dim, float* row) {
  switch (kv) {
    case KvType::kF32:
      return;
    case KvType::kF16: {
      const auto* halves = reinterpret_cast<const float16_t*>(head);
      for (int64_t d = 0; d < head_dim; d += 4)
        vst1q_f32(row + d, vcvt_f32_f16(vld1_f16(halves + d)));
      return;
    }
    case KvType::kQ8: {
      const auto* codes = reinterpret_cast<const int8_t*>(head);
      const float s = head[head_dim / 4];
      for (int64_t d = 0; d < head_dim; d += 8) {
        const int16x8_t wide = vmovl_s8(vld1_s8(codes + d));
        vst1q_f32(row + d, vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(wide))), s));
        vst1q_f32(row + d + 4, vmulq_n_f32(vcvtq_f32_s32(vmovl_high_s16(wide)), s));
      }
      return;
    }
    case KvType::kQ4: {
      const auto* nibbles = reinterpret_cast<const uint8_t*>(head);
      const float* scales = head + head_dim / 8;
      for (int64_t d = 0; d < head_dim; d += 16) {
        const uint8x8_t bytes = vld1_u8(nibbles + d / 2);
        const uint8x8_t low = vand_u8(bytes, vdup_n_u8(15)), high = vshr_n_u8(bytes, 4);
        const int8x16_t codes =
            vsubq_s8(vreinterpretq_s8_u8(vcombine_u8(vzip1_u8(low, high), vzip2_u8(low, high))),
                     vdupq_n_s8(8));
        const float s = scales[d / kKvQ4Group];
        const int16x8_t lo = vmovl_s8(vget_low_s8(codes)), hi = vmovl_high_s8(codes);
        vst1q_f32(row + d, vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(lo))), s));
        vst1q_f32(row + d + 4, vmulq_n_f32(vcvtq_f32_s32(vmovl_high_s16(lo)), s));
        vst1q_f32(row + d + 8, vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(hi))), s));
        vst1q_f32(row + d + 12, vmulq_n_f32(vcvtq_f32_s32(vmovl_high_s16(hi)), s));
      }
      return;
    }
  }
}

}  // namespace

void attend_query(KvType kv, const float* q, int64_t n_keys, const float* keys, const float* values,
                  int64_t kv_stride, int64_t head_dim, float scale, float* scores, float* out) {
  float row[kMaxQuantizedHeadDim];
  const auto head = [&](const float* rows, int64_t j) {
    const float* h = rows + j * kv_stride;
    if (kv == KvType::kF32) return h;
    widen_head(kv, h, head_dim, row);
    return static_cast<const float*>(row);
  };
  for (int64_t j = 0; j < n_keys; ++j) scores[j] = dot(q, head(keys, j), head_dim) * scale;
  ref::softmax(scores, n_keys);
  for (int64_t d = 0; d < head_dim; ++d) out[d] = 0.0f;
  for (int64_t j = 0; j < n_keys; ++j) axpy(scores[j], head(values, j), out, head_dim);
}

}  // namespace qhx::neon
