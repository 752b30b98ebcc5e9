// A weight matrix for kernel and backend tests: float32 weights stored as any weight dtype, with
// the bytes a MatrixRef points into (moving it keeps them valid).
#pragma once

#include <cstdint>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"
#include "kernels/quant.h"

namespace qhx::test {

struct TestMatrix {
  std::vector<float> f32;
  std::vector<uint16_t> half;  // bf16 or f16 bits
  std::vector<int8_t> q8;
  std::vector<uint8_t> q4;
  std::vector<float> row_scales;       // W8
  std::vector<uint16_t> group_scales;  // W4
  MatrixRef ref;

  // w: [rows, cols]; group: W4 only.
  TestMatrix(DType dtype, std::vector<float> w, int64_t rows, int64_t cols, int64_t group = 0,
             Activations activations = Activations::kF32)
      : f32(std::move(w)) {
    ref = {dtype, nullptr, rows, cols};
    switch (dtype) {
      case DType::kBF16:
      case DType::kF16:
        for (const float x : f32)
          half.push_back(dtype == DType::kBF16 ? f32_to_bf16(x) : f32_to_f16(x));
        ref.data = half.data();
        break;
      case DType::kW8:
        q8.resize(rows * cols);
        row_scales.resize(rows);
        quantize_w8(f32.data(), rows, cols, q8.data(), row_scales.data());
        ref.data = q8.data();
        ref.scales = row_scales.data();
        break;
      case DType::kW4:
        q4.resize(rows * cols / 2);
        group_scales.resize(rows * (cols / group));
        quantize_w4(f32.data(), rows, cols, group, q4.data(), group_scales.data());
        ref.data = q4.data();
        ref.scales = group_scales.data();
        ref.group_size = group;
        break;
      default:
        ref.data = f32.data();
        break;
    }
    ref.activations = activations;
  }
};

}  // namespace qhx::test
