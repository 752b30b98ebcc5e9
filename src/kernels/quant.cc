#include "kernels/quant.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <string>

#include "util/error.h"

namespace qhx {
namespace {

// Checked before anything is written: one NaN or inf would poison a whole scale.
void require_finite(const float* w, int64_t rows, int64_t cols, const std::string& where) {
  for (int64_t i = 0; i < rows * cols; ++i) {
    if (!std::isfinite(w[i])) {
      fail(where, "weight at row " + std::to_string(i / cols) + ", column " +
                      std::to_string(i % cols) + " is " + (std::isnan(w[i]) ? "NaN" : "infinite"));
    }
  }
}

float max_abs(const float* x, int64_t n) {
  float m = 0.0f;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, std::fabs(x[i]));
  return m;
}

int quantize_one(float x, float scale, float limit) {
  if (scale == 0.0f) return 0;
  return static_cast<int>(std::clamp(std::nearbyint(x / scale), -limit, limit));
}

}  // namespace

void quantize_w8(const float* w, int64_t rows, int64_t cols, int8_t* q, float* scales) {
  matrix_elements(DType::kW8, rows, cols, 0);
  require_finite(w, rows, cols, matrix_name(DType::kW8, rows, cols, 0));
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = w + r * cols;
    const float scale = max_abs(row, cols) / 127.0f;
    scales[r] = scale;
    for (int64_t c = 0; c < cols; ++c) {
      q[r * cols + c] = static_cast<int8_t>(quantize_one(row[c], scale, 127.0f));
    }
  }
}

void quantize_w4(const float* w, int64_t rows, int64_t cols, int64_t group_size, uint8_t* packed,
                 uint16_t* scales) {
  matrix_elements(DType::kW4, rows, cols, group_size);
  const std::string where = matrix_name(DType::kW4, rows, cols, group_size);
  require_finite(w, rows, cols, where);
  const int64_t groups = cols / group_size;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t first = g * group_size;
      const float* x = w + r * cols + first;
      const float max = max_abs(x, group_size);
      const uint16_t scale_bits = f32_to_f16(max / 7.0f);
      const float scale = f16_to_f32(scale_bits);
      if (std::isinf(scale)) {
        fail(where, "row " + std::to_string(r) + ", columns from " + std::to_string(first) +
                        ": max |w| " + std::to_string(max) + " needs a scale past f16's range");
      }
      scales[r * groups + g] = scale_bits;
      uint8_t* out = packed + (r * cols + first) / 2;
      for (int64_t c = 0; c < group_size; c += 2) {
        const int low = quantize_one(x[c], scale, 7.0f), high = quantize_one(x[c + 1], scale, 7.0f);
        out[c / 2] = static_cast<uint8_t>((low & 0xF) | ((high & 0xF) << 4));
      }
    }
  }
}

}  // namespace qhx
