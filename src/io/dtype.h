// Element types of stored tensors and exact conversions of 16-bit floats to f32.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace qhx {

// kW8 and kW4 are qhx bundle weight formats (int8 per-row and int4 per-group quantisation, laid
// out as kernels/kernels.h MatrixRef describes); safetensors files never hold them.
enum class DType { kF32, kF16, kBF16, kI64, kI32, kI16, kI8, kU8, kBool, kF64, kW8, kW4 };

std::optional<DType> dtype_from_safetensors_name(std::string_view name);
std::string_view dtype_name(DType dtype);
// W8 or W4: integers with scales (kernels/kernels.h MatrixRef).
inline bool is_quantized(DType dtype) {
  return dtype == DType::kW8 || dtype == DType::kW4;
}
// Bytes per element of a plain type. W8 and W4 have no such size (their bytes depend on the
// matrix shape, see matrix_bytes in kernels/quant.h), so they throw Error.
size_t dtype_size(DType dtype);

inline float bf16_to_f32(uint16_t bits) {
  return std::bit_cast<float>(uint32_t{bits} << 16);
}

inline float f16_to_f32(uint16_t bits) {
  const uint32_t sign = uint32_t{bits & 0x8000u} << 16;
  const uint32_t exponent = (bits >> 10) & 0x1Fu;
  uint32_t mantissa = bits & 0x3FFu;
  if (exponent == 0x1F) return std::bit_cast<float>(sign | 0x7F800000u | (mantissa << 13));
  if (exponent != 0)
    return std::bit_cast<float>(sign | ((exponent + 112) << 23) | (mantissa << 13));
  if (mantissa == 0) return std::bit_cast<float>(sign);
  // Subnormal half: renormalise into a normal float.
  int shift = 0;
  while ((mantissa & 0x400u) == 0) {
    mantissa <<= 1;
    ++shift;
  }
  mantissa &= 0x3FFu;
  return std::bit_cast<float>(sign | (uint32_t(113 - shift) << 23) | (mantissa << 13));
}

}  // namespace qhx
