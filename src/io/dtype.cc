#include "io/dtype.h"

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
      return 8;
    case DType::kF32:
    case DType::kI32:
      return 4;
    case DType::kF16:
    case DType::kBF16:
    case DType::kI16:
      return 2;
    case DType::kI8:
    case DType::kU8:
    case DType::kBool:
      return 1;
    case DType::kW8:
    case DType::kW4:
      fail(dtype_name(dtype), "a quantized type has no element size (see matrix_bytes)");
  }
  return 1;
}

}  // namespace qhx
