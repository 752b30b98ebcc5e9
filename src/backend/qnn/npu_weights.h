// The NPU's precision forms of a model's matrices, and the activation ranges its 16-bit forms are
// compiled with. A form says how the projections (every matmul of a layer) compute on the HTP:
//
//   fp16   weights and activations in fp16 (the HTP's float form; a bundle's W8 or W4 weights
//          dequantized)
//   w8a16  int8 weights, one scale per output row (a W8 bundle's own integers and scales as they
//          lie), activations into and out of each matmul in 16-bit fixed point over ranges
//          measured on calibration text (forge npu --calibrate)
//   w4a16  4-bit weights in blocks along each row: a scale per row times a 4-bit integer scale
//          per block (QNN's blockwise expansion, the form the HTP takes 4-bit blocks in), 16-bit
//          activations as w8a16
//
// The norms, residual adds and gates between the matmuls compute in fp16 in every form.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string_view>
#include <vector>

#include "backend/qnn/qnn_abi.h"
#include "core/tensor.h"

namespace qhx {

enum class NpuForm { kF16, kW8A16, kW4A16 };
std::string_view npu_form_name(NpuForm form);  // "fp16", "w8a16", "w4a16"
std::optional<NpuForm> parse_npu_form(std::string_view name);

// The values a matmul reads and writes, as calibration saw them: [lo, hi] with 0 inside.
struct ActivationRange {
  float lo = 0, hi = 0;
  void include(float v);
  bool operator==(const ActivationRange&) const = default;
};
struct MatmulRanges {
  ActivationRange in, out;
  bool operator==(const MatmulRanges&) const = default;
};
// By weight id (MatrixRef::id).
using ActivationRanges = std::map<int64_t, MatmulRanges>;

// QNN's 16-bit unsigned form of a range: real = (q + offset) · scale over q in 0..65535, the
// range widened by `margin` of its span on each side (text unlike the calibration's may reach
// past it) and 0 exactly representable.
qnn::ScaleOffset uf16_encoding(const ActivationRange& range, float margin = 0.125f);

// int8 per output row: a W8 matrix's own integers and scales; any other, rounded symmetrically
// (scale = the row's largest magnitude / 127).
struct Int8Rows {
  std::vector<int8_t> values;  // [rows, cols]
  std::vector<float> scales;   // [rows]
};
Int8Rows int8_rows(const MatrixRef& w);

// 4-bit blocks with two-level scales: element (r, c) = values · row_scales[r] ·
// block_scales[r][c / block], block scales in 1..15. From a W4 matrix's groups (each group scale
// rounded to a whole step, down or up as reproduces the group better, and its integers rounded
// again to it), or from any other
// matrix's values in blocks of `block` (halved down to 8 until it divides the columns). Blocks
// are a multiple of 32 columns or a power of two, what the HTP computes right: a W4 group of 48
// becomes three blocks of 16 with its scale.
struct Int4Blocks {
  int64_t block = 0;
  std::vector<int8_t> values;         // [rows, cols], each in -8..7, one per byte
  std::vector<float> row_scales;      // [rows]
  std::vector<uint8_t> block_scales;  // [rows, cols / block]
};
inline constexpr int64_t kDefaultNpuBlock = 64;
Int4Blocks int4_blocks(const MatrixRef& w, int64_t block = kDefaultNpuBlock);

}  // namespace qhx
