// Element types of stored tensors and exact conversions of 16-bit floats to f32.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace qhx {

// kW8 and kW4 are qhx bundle weight formats (int8 per-row and int4 per-group quantisation, laid
// out as core/tensor.h MatrixRef describes); safetensors files never hold them.
// The safetensors dtypes of one byte or more (a file holding any of them parses; only float
// ones are weights qhx computes with: an FP8 vision tower or MTP head of a checkpoint is read
// past, as transformers reads past what it does not load), and qhx's own W8/W4.
enum class DType {
  kF32,
  kF16,
  kBF16,
  kI64,
  kI32,
  kI16,
  kI8,
  kU8,
  kBool,
  kF64,
  kU16,
  kU32,
  kU64,
  kF8E4M3,
  kF8E5M2,
  kF8E8M0,
  kC64,
  kW8,
  kW4
};

std::optional<DType> dtype_from_safetensors_name(std::string_view name);
std::string_view dtype_name(DType dtype);
// W8 or W4: integers with scales (core/tensor.h MatrixRef).
inline bool is_quantized(DType dtype) {
  return dtype == DType::kW8 || dtype == DType::kW4;
}
// Bytes per element of a plain type. W8 and W4 have no such size (their bytes depend on the
// matrix shape, see matrix_bytes), so they throw Error.
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

// float32 → bfloat16 / IEEE half bits, rounding to nearest, ties to even. NaN stays NaN (quiet,
// sign and leading payload bits kept); past the largest finite value rounds to ±inf; f16
// subnormals are exact; ±0 keep their sign.
uint16_t f32_to_bf16(float x);
uint16_t f32_to_f16(float x);

// "W4 [rows, cols], group g": what layout and quantiser messages are about.
std::string matrix_name(DType dtype, int64_t rows, int64_t cols, int64_t group_size);
// rows · cols, once the layout is known to be possible (else Error naming the matrix).
uint64_t matrix_elements(DType dtype, int64_t rows, int64_t cols, int64_t group_size);
// Bytes of the data part and of the scales of a [rows, cols] matrix stored as `dtype`: plain
// types have no scales, W8 one f32 per row, W4 one f16 per group. group_size must be 0 except
// for W4, where it is positive, even and divides cols. Throws Error on an impossible layout.
uint64_t matrix_bytes(DType dtype, int64_t rows, int64_t cols, int64_t group_size);
uint64_t matrix_scale_bytes(DType dtype, int64_t rows, int64_t cols, int64_t group_size);

}  // namespace qhx
