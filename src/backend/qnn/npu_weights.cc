#include "backend/qnn/npu_weights.h"

#include <algorithm>
#include <cmath>
#include <span>

#include "core/dtype.h"
#include "kernels/kernels.h"
#include "util/error.h"

namespace qhx {

std::string_view npu_form_name(NpuForm form) {
  switch (form) {
    case NpuForm::kF16:
      return "fp16";
    case NpuForm::kW8A16:
      return "w8a16";
    case NpuForm::kW4A16:
      return "w4a16";
  }
  return "?";
}

std::optional<NpuForm> parse_npu_form(std::string_view name) {
  for (const NpuForm f : {NpuForm::kF16, NpuForm::kW8A16, NpuForm::kW4A16}) {
    if (npu_form_name(f) == name) return f;
  }
  return std::nullopt;
}

void ActivationRange::include(float v) {
  lo = std::min(lo, v);
  hi = std::max(hi, v);
}

qnn::ScaleOffset uf16_encoding(const ActivationRange& range, float margin) {
  const float span = std::max(range.hi - range.lo, 1e-6f);
  const float lo = std::min(range.lo - margin * span, 0.0f);
  const float hi = std::max(range.hi + margin * span, 0.0f);
  const float scale = (hi - lo) / 65535.0f;
  // real = (q + offset) · scale: q = -offset is 0 exactly.
  return {scale, static_cast<int32_t>(std::lround(lo / scale))};
}

namespace {

std::vector<float> row_values(const MatrixRef& w, int64_t r) {
  std::vector<float> row(static_cast<size_t>(w.cols));
  ref::read_row(w, r, row.data());
  return row;
}

float largest_magnitude(std::span<const float> v) {
  float m = 0;
  for (const float x : v) m = std::max(m, std::fabs(x));
  return m;
}

}  // namespace

Int8Rows int8_rows(const MatrixRef& w) {
  Int8Rows out;
  out.values.resize(static_cast<size_t>(w.rows * w.cols));
  out.scales.resize(static_cast<size_t>(w.rows));
  for (int64_t r = 0; r < w.rows; ++r) {
    int8_t* q = out.values.data() + r * w.cols;
    if (w.dtype == DType::kW8) {  // as it lies
      std::copy_n(static_cast<const int8_t*>(w.data) + r * w.cols, w.cols, q);
      out.scales[r] = static_cast<const float*>(w.scales)[r];
      continue;
    }
    const std::vector<float> row = row_values(w, r);
    const float m = largest_magnitude(row);
    const float scale = m > 0 ? m / 127.0f : 1.0f;
    out.scales[r] = scale;
    for (int64_t c = 0; c < w.cols; ++c) {
      q[c] = static_cast<int8_t>(std::clamp<long>(std::lround(row[c] / scale), -127, 127));
    }
  }
  return out;
}

Int4Blocks int4_blocks(const MatrixRef& w, int64_t block) {
  Int4Blocks out;
  // Blocks the HTP computes right: a multiple of 32 or a power of two (blocks of 24 and 48 give
  // wrong values on HTP 5.51). A W4 matrix's groups are cut into such blocks, each keeping its
  // group's scale.
  const auto takes = [](int64_t b) { return b > 0 && (b % 32 == 0 || (b & (b - 1)) == 0); };
  out.block = w.dtype == DType::kW4 ? w.group_size : block;
  if (!takes(out.block)) out.block &= -out.block;  // its largest power-of-two divisor
  while (out.block > 8 && w.cols % out.block != 0) out.block /= 2;  // the largest that divides
  if (out.block < 8 || w.cols % out.block != 0 || !takes(out.block)) {
    fail("NPU w4a16", "a matrix of " + std::to_string(w.cols) + " columns in blocks of " +
                          std::to_string(out.block));
  }
  const int64_t blocks = w.cols / out.block;
  out.values.resize(static_cast<size_t>(w.rows * w.cols));
  out.row_scales.resize(static_cast<size_t>(w.rows));
  out.block_scales.resize(static_cast<size_t>(w.rows * blocks));
  std::vector<float> wanted(static_cast<size_t>(blocks));  // each block's own scale
  for (int64_t r = 0; r < w.rows; ++r) {
    const std::vector<float> row = row_values(w, r);
    for (int64_t b = 0; b < blocks; ++b) {
      if (w.dtype == DType::kW4) {
        const int64_t group = b * out.block / w.group_size, groups = w.cols / w.group_size;
        wanted[b] = f16_to_f32(static_cast<const uint16_t*>(w.scales)[r * groups + group]);
      } else {
        wanted[b] = largest_magnitude(std::span(row).subspan(b * out.block, out.block)) / 7.0f;
      }
    }
    const float top = *std::max_element(wanted.begin(), wanted.end());
    const float row_scale = top > 0 ? top / 15.0f : 1.0f;
    out.row_scales[r] = row_scale;
    for (int64_t b = 0; b < blocks; ++b) {
      // The block's scale is its wanted one rounded to a whole step of row_scale, down or up,
      // whichever reproduces the block's values better: rounded down, its largest values may
      // be clipped to the 4-bit range; rounded up, the grid is coarser.
      const std::span<const float> values = std::span(row).subspan(b * out.block, out.block);
      const auto quantize = [&](long steps, int8_t* q) {
        const float scale = row_scale * static_cast<float>(steps);
        double error = 0;
        for (size_t c = 0; c < values.size(); ++c) {
          const long v = std::clamp<long>(std::lround(values[c] / scale), -8, 7);
          if (q != nullptr) q[c] = static_cast<int8_t>(v);
          error += std::pow(values[c] - static_cast<float>(v) * scale, 2);
        }
        return error;
      };
      const float steps = wanted[b] / row_scale;
      const long down = std::clamp<long>(std::lround(std::floor(steps)), 1, 15);
      const long up = std::clamp<long>(std::lround(std::ceil(steps)), 1, 15);
      const long best = quantize(down, nullptr) <= quantize(up, nullptr) ? down : up;
      out.block_scales[r * blocks + b] = static_cast<uint8_t>(best);
      quantize(best, out.values.data() + r * w.cols + b * out.block);
    }
  }
  return out;
}

}  // namespace qhx
