// The int8 activations of one matmul_int8 call, quantized and laid out as a SIMD kernel reads
// them. Internal to src/kernels: the x86 kernels (matmul_int8.cc) and the NEON ones
// (matmul_int8_neon.cc) share it, each with its own vectorised copy of ref::quantize_activations
// (the same float32 operations, so the same bits on every ISA).
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/kernels.h"

namespace qhx {

// The quantized activations of one call, in the column order and with the per-lane scales the
// chosen kernel reads. A lane is the run of lane_bytes kernel bytes that one scale (and one
// offset) covers: 4 for the x86 kernels (one 32-bit lane of their integer multiply-adds),
// kActivationBlock for NEON (one scale per block).
struct Int8Activations {
  int64_t cols = 0;
  int64_t lanes = 0;                 // per token: cols rounded up to chunks, / lane_bytes
  std::vector<int8_t> q;             // [n_tokens, cols], in kernel order
  std::vector<float> lane_scales;    // [n_tokens, lanes]: the block scale of each lane's bytes
  std::vector<float> lane_offsets;   // W4: [n_tokens, lanes], 8 · scale · Σ the lane's q_x
  std::vector<float> token_offsets;  // W8 with VNNI: [n_tokens], Σ_b sx_b · Σ_{c∈b} q_x
  // [n_tokens, block_stride]: each block's scale, compact (a kernel that spreads them over its
  // lanes itself reads 8 times less than lane_scales), then zeros up to block_stride, so a
  // 16-float load from any block stays inside the array.
  std::vector<float> block_scales;
  int64_t block_stride = 0;

  const int8_t* q_of(int64_t t) const { return q.data() + t * cols; }
  const float* scales_of(int64_t t) const { return lane_scales.data() + t * lanes; }
  const float* offsets_of(int64_t t) const { return lane_offsets.data() + t * lanes; }
  const float* block_scales_of(int64_t t) const { return block_scales.data() + t * block_stride; }
};

// ref::quantize_activations for one token (same signature and bits).
using QuantizeToken = void (*)(const float* x, int64_t cols, int8_t* q, float* scales);

// Quantizes every token with `quantize` and lays it out for a kernel reading `chunk`-byte vectors
// (a multiple of kActivationBlock) with `lane_bytes`-byte lanes (4 or kActivationBlock): the
// per-lane scales, and the per-token (W8 offset, token_offset) or per-lane (W4 offset,
// lane_offset ≠ 0) corrections. nibble_split (W4) orders each chunk as its even columns, then its
// odd ones, matching weights unpacked as all low nibbles then all high nibbles.
void prepare_activations(QuantizeToken quantize, const float* x, int64_t n_tokens, int64_t cols,
                         int64_t chunk, int64_t lane_bytes, bool nibble_split, float lane_offset,
                         bool token_offset, Int8Activations& a);

}  // namespace qhx
