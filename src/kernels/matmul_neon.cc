// The NEON matmul rows (kernels/neon.h): every weight dtype is widened to f32 sixteen columns at a
// time and multiplied into the f32 activations with fused multiply-adds.
#include <arm_neon.h>

#include <cmath>
#include <cstdlib>

#include "kernels/neon.h"
#include "kernels/token_blocks.h"

namespace qhx::neon {
namespace {

// Sixteen consecutive weights of each dtype widened to f32 (W8/W4 as their integer values,
// scaled later).
float32x4x4_t load16_f32(const float* p) {
  return {vld1q_f32(p), vld1q_f32(p + 4), vld1q_f32(p + 8), vld1q_f32(p + 12)};
}

// A bf16 is the high half of an f32.
float32x4x4_t load16_bf16(const uint16_t* p) {
  const uint16x8_t first = vld1q_u16(p), second = vld1q_u16(p + 8);
  return {vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(first), 16)),
          vreinterpretq_f32_u32(vshll_high_n_u16(first, 16)),
          vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(second), 16)),
          vreinterpretq_f32_u32(vshll_high_n_u16(second, 16))};
}

float32x4x4_t load16_f16(const uint16_t* p) {
  const float16x8_t first = vreinterpretq_f16_u16(vld1q_u16(p));
  const float16x8_t second = vreinterpretq_f16_u16(vld1q_u16(p + 8));
  return {vcvt_f32_f16(vget_low_f16(first)), vcvt_high_f32_f16(first),
          vcvt_f32_f16(vget_low_f16(second)), vcvt_high_f32_f16(second)};
}

float32x4x4_t widen16_i8(int8x16_t q) {
  const int16x8_t first = vmovl_s8(vget_low_s8(q)), second = vmovl_high_s8(q);
  return {vcvtq_f32_s32(vmovl_s16(vget_low_s16(first))), vcvtq_f32_s32(vmovl_high_s16(first)),
          vcvtq_f32_s32(vmovl_s16(vget_low_s16(second))), vcvtq_f32_s32(vmovl_high_s16(second))};
}

float32x4x4_t load16_i8(const int8_t* p) {
  return widen16_i8(vld1q_s8(p));
}

// Eight packed bytes, column 2b in the low nibble of byte b and 2b+1 in the high one.
float32x4x4_t load16_i4(const uint8_t* p) {
  const int8x8_t bytes = vreinterpret_s8_u8(vld1_u8(p));
  const int8x8_t low = vshr_n_s8(vshl_n_s8(bytes, 4), 4);  // arithmetic shifts sign-extend
  const int8x8_t high = vshr_n_s8(bytes, 4);
  return widen16_i8(vcombine_s8(vzip1_s8(low, high), vzip2_s8(low, high)));
}

float i4_at(const uint8_t* packed, int64_t c) {
  const int nibble = (packed[c / 2] >> (c % 2 * 4)) & 0xF;
  return static_cast<float>((nibble ^ 8) - 8);
}

// For each of NT tokens, out[t] = Σ x[t][c] · weight(c) over columns [begin, end): four 4-wide
// accumulators over sixteen columns at a time (load16(c) widens columns c..c+15), then one
// column at a time. The tokens share each weight load (prefill); every token's arithmetic is the
// same for any NT, so a token computed alone gets the same bits.
template <int NT, typename Load16, typename Weight>
inline void dot(const float* const* x, int64_t begin, int64_t end, Load16 load16, Weight weight,
                float* out) {
  float32x4_t acc[NT][4];
  for (int t = 0; t < NT; ++t) {
    for (int k = 0; k < 4; ++k) acc[t][k] = vdupq_n_f32(0.0f);
  }
  int64_t c = begin;
  for (; c + 16 <= end; c += 16) {
    const float32x4x4_t w = load16(c);
    for (int k = 0; k < 4; ++k) {
      for (int t = 0; t < NT; ++t) {
        acc[t][k] = vfmaq_f32(acc[t][k], w.val[k], vld1q_f32(x[t] + c + 4 * k));
      }
    }
  }
  for (int t = 0; t < NT; ++t) {
    out[t] =
        vaddvq_f32(vaddq_f32(vaddq_f32(acc[t][0], acc[t][1]), vaddq_f32(acc[t][2], acc[t][3])));
  }
  for (; c < end; ++c) {
    const float wc = weight(c);
    // Explicit fma: whether the compiler would contract a*b+c must not depend on NT.
    for (int t = 0; t < NT; ++t) out[t] = std::fma(wc, x[t][c], out[t]);
  }
}

// dot over a whole row of an unquantised (or W8) dtype: load16 widens sixteen elements from a
// pointer, widen one element.
template <int NT, typename T, typename Load16, typename Widen>
inline void dot_row_of(const T* row, const float* const* x, int64_t n, Load16 load16, Widen widen,
                       float* out) {
  dot<NT>(
      x, 0, n, [row, load16](int64_t c) { return load16(row + c); },
      [row, widen](int64_t c) { return widen(row[c]); }, out);
}

// Row r of w against NT tokens.
template <int NT>
void dot_row(const MatrixRef& w, int64_t r, const float* const* x, float* out) {
  const int64_t n = w.cols;
  switch (w.dtype) {
    case DType::kF32:
      return dot_row_of<NT>(
          static_cast<const float*>(w.data) + r * n, x, n, load16_f32, [](float v) { return v; },
          out);
    case DType::kBF16:
      return dot_row_of<NT>(static_cast<const uint16_t*>(w.data) + r * n, x, n, load16_bf16,
                            bf16_to_f32, out);
    case DType::kF16:
      return dot_row_of<NT>(static_cast<const uint16_t*>(w.data) + r * n, x, n, load16_f16,
                            f16_to_f32, out);
    case DType::kW8: {
      dot_row_of<NT>(
          static_cast<const int8_t*>(w.data) + r * n, x, n, load16_i8,
          [](int8_t v) { return static_cast<float>(v); }, out);
      const float scale = static_cast<const float*>(w.scales)[r];
      for (int t = 0; t < NT; ++t) out[t] = scale * out[t];
      return;
    }
    case DType::kW4: {
      // Per group: Σ x·q in f32, then times the group's scale. Groups start at even columns,
      // so packed + c/2 holds column c in its low nibble.
      const uint8_t* packed = static_cast<const uint8_t*>(w.data) + r * n / 2;
      const uint16_t* scales = static_cast<const uint16_t*>(w.scales) + r * (n / w.group_size);
      for (int t = 0; t < NT; ++t) out[t] = 0.0f;
      for (int64_t g = 0; g < n / w.group_size; ++g) {
        float group[NT];
        dot<NT>(
            x, g * w.group_size, (g + 1) * w.group_size,
            [packed](int64_t c) { return load16_i4(packed + c / 2); },
            [packed](int64_t c) { return i4_at(packed, c); }, group);
        const float scale = f16_to_f32(scales[g]);
        for (int t = 0; t < NT; ++t) out[t] = std::fma(scale, group[t], out[t]);
      }
      return;
    }
    default:
      std::abort();  // callers only build MatrixRefs of weight types
  }
}

}  // namespace

void matmul_rows(const float* x, int64_t n_tokens, const MatrixRef& w, float* y, int64_t row_begin,
                 int64_t row_end) {
  // Four tokens per weight load: 16 of the 32 registers.
  rows_by_token_blocks<4>(
      x, n_tokens, w, y, row_begin, row_end,
      [&]<int NT>(int64_t r, const float* const* xs, float* out) { dot_row<NT>(w, r, xs, out); });
}

}  // namespace qhx::neon
