#include "kernels/quant.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <string>

#include "util/error.h"

namespace qhx {
namespace {

// "W4 [rows, cols], group g": what every layout and quantiser message is about.
std::string matrix_name(DType dtype, int64_t rows, int64_t cols, int64_t group_size) {
  std::string s = std::string(dtype_name(dtype)) + " [" + std::to_string(rows) + ", " +
                  std::to_string(cols) + "]";
  if (group_size != 0) s += ", group " + std::to_string(group_size);
  return s;
}

// Elements of a [rows, cols] matrix, once its layout is known to be possible.
uint64_t checked_elements(DType dtype, int64_t rows, int64_t cols, int64_t group_size) {
  const auto where = [&] { return matrix_name(dtype, rows, cols, group_size); };
  if (rows < 0 || cols < 0) fail(where(), "negative dimension");
  // Up to 2^56 elements, so every byte count fits in 64 bits.
  if (cols != 0 && rows > (int64_t{1} << 56) / cols) fail(where(), "too many elements");
  if (dtype == DType::kW4) {
    // Even groups keep every group, and so every row, to whole bytes.
    if (group_size <= 0 || group_size % 2 != 0) fail(where(), "group size must be positive, even");
    if (cols % group_size != 0) fail(where(), "group size does not divide the columns");
  } else if (group_size != 0) {
    fail(where(), "only W4 has groups");
  }
  return static_cast<uint64_t>(rows) * static_cast<uint64_t>(cols);
}

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

uint16_t f32_to_bf16(float x) {
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  // Truncating a NaN whose payload is all in the low half would make it inf: force it quiet.
  if (std::isnan(x)) return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  // Round to nearest even on the 16 dropped bits; a carry moves into the exponent, which also
  // rounds past the largest finite value to inf.
  return static_cast<uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
}

uint16_t f32_to_f16(float x) {
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  const uint32_t sign = (bits >> 16) & 0x8000u;
  const uint32_t abs = bits & 0x7FFFFFFFu;
  if (abs > 0x7F800000u) return static_cast<uint16_t>(sign | 0x7E00u | ((abs >> 13) & 0x1FFu));
  if (abs >= 0x47800000u) return static_cast<uint16_t>(sign | 0x7C00u);  // ≥ 2^16, inf included
  if (abs < 0x33000000u) return static_cast<uint16_t>(sign);  // < 2^-25: nearer zero than 2^-24
  // Split into the bits a half keeps (`mantissa >> shift`, exponent included for normals) and
  // the bits it drops.
  uint32_t mantissa, shift;
  if (abs >= 0x38800000u) {  // ≥ 2^-14, a normal half: rebias the exponent from 127 to 15
    mantissa = abs - (112u << 23);
    shift = 13;
  } else {  // a subnormal half counts units of 2^-24
    mantissa = 0x800000u | (abs & 0x7FFFFFu);
    shift = 126 - (abs >> 23);
  }
  uint32_t half = mantissa >> shift;
  const uint32_t rest = mantissa & ((1u << shift) - 1), midpoint = 1u << (shift - 1);
  // A carry out of the mantissa bumps the exponent: the next binade, the smallest normal, or inf.
  if (rest > midpoint || (rest == midpoint && (half & 1u))) ++half;
  return static_cast<uint16_t>(sign | half);
}

uint64_t matrix_bytes(DType dtype, int64_t rows, int64_t cols, int64_t group_size) {
  const uint64_t n = checked_elements(dtype, rows, cols, group_size);
  switch (dtype) {
    case DType::kW8:
      return n;
    case DType::kW4:
      return n / 2;
    default:
      return n * dtype_size(dtype);
  }
}

uint64_t matrix_scale_bytes(DType dtype, int64_t rows, int64_t cols, int64_t group_size) {
  checked_elements(dtype, rows, cols, group_size);
  switch (dtype) {
    case DType::kW8:
      return static_cast<uint64_t>(rows) * sizeof(float);
    case DType::kW4:
      return static_cast<uint64_t>(rows * (cols / group_size)) * sizeof(uint16_t);
    default:
      return 0;
  }
}

void quantize_w8(const float* w, int64_t rows, int64_t cols, int8_t* q, float* scales) {
  checked_elements(DType::kW8, rows, cols, 0);
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
  checked_elements(DType::kW4, rows, cols, group_size);
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
