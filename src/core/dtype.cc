#include "core/dtype.h"

#include <cmath>
#include <cstring>
#include <string>

#include "util/error.h"

namespace qhx {

std::optional<DType> dtype_from_safetensors_name(std::string_view name) {
  if (name == "F32") return DType::kF32;
  if (name == "F16") return DType::kF16;
  if (name == "BF16") return DType::kBF16;
  if (name == "F64") return DType::kF64;
  if (name == "I64") return DType::kI64;
  if (name == "I32") return DType::kI32;
  if (name == "I16") return DType::kI16;
  if (name == "I8") return DType::kI8;
  if (name == "U8") return DType::kU8;
  if (name == "BOOL") return DType::kBool;
  if (name == "U16") return DType::kU16;
  if (name == "U32") return DType::kU32;
  if (name == "U64") return DType::kU64;
  if (name == "F8_E4M3") return DType::kF8E4M3;
  if (name == "F8_E5M2") return DType::kF8E5M2;
  if (name == "F8_E8M0") return DType::kF8E8M0;
  if (name == "C64") return DType::kC64;
  return std::nullopt;
}

std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "F32";
    case DType::kF16:
      return "F16";
    case DType::kBF16:
      return "BF16";
    case DType::kF64:
      return "F64";
    case DType::kI64:
      return "I64";
    case DType::kI32:
      return "I32";
    case DType::kI16:
      return "I16";
    case DType::kI8:
      return "I8";
    case DType::kU8:
      return "U8";
    case DType::kBool:
      return "BOOL";
    case DType::kU16:
      return "U16";
    case DType::kU32:
      return "U32";
    case DType::kU64:
      return "U64";
    case DType::kF8E4M3:
      return "F8_E4M3";
    case DType::kF8E5M2:
      return "F8_E5M2";
    case DType::kF8E8M0:
      return "F8_E8M0";
    case DType::kC64:
      return "C64";
    case DType::kW8:
      return "W8";
    case DType::kW4:
      return "W4";
  }
  return "?";
}

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kF64:
    case DType::kI64:
    case DType::kU64:
    case DType::kC64:
      return 8;
    case DType::kF32:
    case DType::kI32:
    case DType::kU32:
      return 4;
    case DType::kF16:
    case DType::kBF16:
    case DType::kI16:
    case DType::kU16:
      return 2;
    case DType::kI8:
    case DType::kU8:
    case DType::kBool:
    case DType::kF8E4M3:
    case DType::kF8E5M2:
    case DType::kF8E8M0:
      return 1;
    case DType::kW8:
    case DType::kW4:
      fail(dtype_name(dtype), "a quantized type has no element size (see matrix_bytes)");
  }
  return 1;
}

std::string matrix_name(DType dtype, int64_t rows, int64_t cols, int64_t group_size) {
  std::string s = std::string(dtype_name(dtype)) + " [" + std::to_string(rows) + ", " +
                  std::to_string(cols) + "]";
  if (group_size != 0) s += ", group " + std::to_string(group_size);
  return s;
}

uint64_t matrix_elements(DType dtype, int64_t rows, int64_t cols, int64_t group_size) {
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
  const uint64_t n = matrix_elements(dtype, rows, cols, group_size);
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
  matrix_elements(dtype, rows, cols, group_size);
  switch (dtype) {
    case DType::kW8:
      return static_cast<uint64_t>(rows) * sizeof(float);
    case DType::kW4:
      return static_cast<uint64_t>(rows * (cols / group_size)) * sizeof(uint16_t);
    default:
      return 0;
  }
}

}  // namespace qhx
