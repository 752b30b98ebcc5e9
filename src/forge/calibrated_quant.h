// Calibrated weight quantization: the stored formats of kernels/quant.h (W8: int8 per row; W4:
// int4 per group of columns with an f16 scale), with scales and rounding chosen for the inputs
// the matrix meets on calibration text rather than for its weights alone. A matrix's inputs are
// summarised by their Gram matrix G = Σ x xᵀ (the Hessian of the matrix's output error): the
// product's error over the calibration rows is Σ_r (w_r − ŵ_r) G (w_r − ŵ_r)ᵀ.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

namespace qhx {

enum class CalibrationMethod {
  // Each group's scale minimises Σ_c G_cc (w_c − s·q_c)² (llama.cpp's importance-weighted
  // search, G's diagonal being its importance matrix): candidate scales that clip the group's
  // extremes by up to 30 % or widen past them, each refined by weighted least squares.
  kWeighted,
  // The same scales, and the columns rounded in order, each rounding error spread over the
  // columns not yet rounded through the inverse of G, so that the product's error, not each
  // weight's, is made small (GPTQ: Frantar et al., 2022, without reordering columns).
  kGptq,
};

std::optional<CalibrationMethod> parse_calibration_method(std::string_view name);
std::string_view calibration_method_name(CalibrationMethod method);

// G: [cols, cols], symmetric, positive semi-definite (row-major). Columns no calibration row
// reached (G_cc = 0) are rounded as the plain quantizer rounds them. Throws Error on a bad layout
// or a non-finite weight, as quantize_w8/quantize_w4 do.
void quantize_w8_calibrated(const float* w, int64_t rows, int64_t cols,
                            std::span<const double> gram, CalibrationMethod method, int8_t* q,
                            float* scales);

// q in [-8, 7] (the format's whole int4 range; the plain quantizer keeps to ±7).
void quantize_w4_calibrated(const float* w, int64_t rows, int64_t cols, int64_t group_size,
                            std::span<const double> gram, CalibrationMethod method, uint8_t* packed,
                            uint16_t* scales);

}  // namespace qhx
