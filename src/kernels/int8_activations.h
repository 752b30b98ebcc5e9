// The int8 activations of one matmul_int8 call, quantized and laid out as a SIMD kernel reads
// them. Internal to src/kernels: the x86 kernels (matmul_int8.cc) and the NEON ones
// (matmul_int8_neon.cc) share it, each with its own vectorised copy of ref::quantize_activations
// (the same float32 operations, so the same bits on every ISA).
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/kernels.h"

namespace qhx {

class CpuContext;

// The quantized activations of one call, in the column order the chosen kernel reads, with each
// block's scale and the corrections for weights that enter the integer multiply-adds offset.
struct Int8Activations {
  int64_t cols = 0;
  std::vector<int8_t> q;  // [n_tokens, cols], in kernel order
  // [n_tokens, block_stride]: each block's scale, then zeros up to block_stride, so a 16-float
  // load from any block stays inside the array (kernels spread them over their lanes).
  std::vector<float> block_scales;
  int64_t block_stride = 0;
  // W4 on AVX2: [n_tokens, cols / 8], for each lane pair of a chunk (the 4 bytes of lane i in
  // its even-column half and the 4 of lane i in its odd-column half, which a kernel sums into
  // one 32-bit lane) −nibble_offset · Σ of their 8 q_x: the integer multiply-adds start from it,
  // so offset nibbles come out as exact sums of q_w · q_x.
  std::vector<int32_t> pair_corrections;
  int64_t pairs = 0;
  // Panels (AVX-512 VNNI): [n_tokens, cols / kActivationBlock], −block_offset · Σ_{c∈b} q_x.
  std::vector<int32_t> block_corrections;

  const int8_t* q_of(int64_t t) const { return q.data() + t * cols; }
  const float* block_scales_of(int64_t t) const { return block_scales.data() + t * block_stride; }
  const int32_t* corrections_of(int64_t t) const { return pair_corrections.data() + t * pairs; }
  const int32_t* block_corrections_of(int64_t t) const {
    return block_corrections.data() + t * (cols / kActivationBlock);
  }
};

// ref::quantize_activations for one token (same signature and bits).
using QuantizeToken = void (*)(const float* x, int64_t cols, int8_t* q, float* scales);

// How a kernel reads the activations and which corrections its offset weights need.
struct ActivationLayout {
  int64_t chunk = kActivationBlock;  // bytes per vector, a multiple of kActivationBlock
  // W4: each chunk ordered as its even columns, then its odd ones, matching weights unpacked as
  // all low nibbles then all high nibbles (chunk divides cols: W4 groups are whole chunks).
  bool nibble_split = false;
  int32_t nibble_offset = 0;  // ≠ 0: pair_corrections for weights that enter as q + offset
  int32_t block_offset = 0;   // ≠ 0: block_corrections for weights that enter as q + offset
};

// Quantizes every token with `quantize` and lays it out as `layout` says.
// Tokens spread over the threads of cx.
void prepare_activations(CpuContext& cx, QuantizeToken quantize, const float* x, int64_t n_tokens,
                         int64_t cols, const ActivationLayout& layout, Int8Activations& a);

// Row r of a W4 matrix: its packed bytes and its f16 group scales.
inline const uint8_t* w4_row(const MatrixRef& w, int64_t r) {
  return static_cast<const uint8_t*>(w.data) + r * w.cols / 2;
}
inline const uint16_t* w4_group_scales(const MatrixRef& w, int64_t r) {
  return static_cast<const uint16_t*>(w.scales) + r * (w.cols / w.group_size);
}

// One tile of MR rows from r0 × NR tokens from t0 of a W8 or W4 matrix, written into y: the row
// pointers, the kernel's tile (Tiles::template w8<MR, NR>(rows, a, t0, out) and
// Tiles::template w4<MR, NR>(rows, group_scales, group_size, a, t0, out)), and the W8 row scale
// the W8 tiles leave to their caller.
template <typename Tiles, int MR, int NR>
inline void run_int8_tile(const MatrixRef& w, const Int8Activations& a, int64_t r0, int64_t t0,
                          float* y) {
  float out[MR][NR];
  float row_scale[MR];
  if (w.dtype == DType::kW8) {
    const int8_t* rows[MR];
    for (int r = 0; r < MR; ++r) {
      rows[r] = static_cast<const int8_t*>(w.data) + (r0 + r) * w.cols;
      row_scale[r] = static_cast<const float*>(w.scales)[r0 + r];
    }
    Tiles::template w8<MR, NR>(rows, a, t0, out);
  } else {
    const uint8_t* rows[MR];
    const uint16_t* group_scales[MR];
    for (int r = 0; r < MR; ++r) {
      rows[r] = w4_row(w, r0 + r);
      group_scales[r] = w4_group_scales(w, r0 + r);
      row_scale[r] = 1.0f;  // the group scales are applied inside the tile
    }
    Tiles::template w4<MR, NR>(rows, group_scales, w.group_size, a, t0, out);
  }
  for (int r = 0; r < MR; ++r) {
    for (int t = 0; t < NR; ++t) y[(t0 + t) * w.rows + r0 + r] = row_scale[r] * out[r][t];
  }
}

}  // namespace qhx
