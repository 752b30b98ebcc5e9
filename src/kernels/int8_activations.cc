#include "kernels/int8_activations.h"

#include "kernels/thread_pool.h"

namespace qhx {
namespace {

// How the kernel lays out a token: the column of kernel byte i within each chunk.
//   natural: i. nibble-split (W4): the chunk's even columns, then its odd ones, matching
//   weights unpacked as all low nibbles then all high nibbles.
int64_t column_of_byte(bool nibble_split, int64_t chunk, int64_t i) {
  if (!nibble_split) return i;
  const int64_t half = chunk / 2;
  return i < half ? 2 * i : 2 * (i - half) + 1;
}

}  // namespace

void prepare_activations(QuantizeToken quantize, const float* x, int64_t n_tokens, int64_t cols,
                         int64_t chunk, int64_t lane_bytes, bool nibble_split, float lane_offset,
                         bool token_offset, Int8Activations& a) {
  a.cols = cols;
  a.lanes = (cols + chunk - 1) / chunk * chunk / lane_bytes;
  a.q.resize(n_tokens * cols);
  a.lane_scales.resize(n_tokens * a.lanes);
  a.lane_offsets.resize(lane_offset != 0.0f ? n_tokens * a.lanes : 0);
  a.token_offsets.resize(token_offset ? n_tokens : 0);
  const int64_t n_blocks = cols / kActivationBlock;
  a.block_stride = n_blocks + 16;
  a.block_scales.assign(n_tokens * a.block_stride, 0.0f);
  auto prepare = [&](int64_t t) {
    thread_local std::vector<int8_t> split;
    float* sx = a.block_scales.data() + t * a.block_stride;
    int8_t* q = a.q.data() + t * cols;
    float* lane_scales = a.lane_scales.data() + t * a.lanes;
    float* lane_offsets = lane_offset != 0.0f ? a.lane_offsets.data() + t * a.lanes : nullptr;
    // Quantized in place when the kernel reads the columns in order; else reordered from a copy.
    int8_t* quantized = q;
    if (nibble_split) {
      split.resize(cols);
      quantized = split.data();
    }
    quantize(x + t * cols, cols, quantized, sx);
    for (int64_t lane = 0; lane < a.lanes; ++lane) {
      const int64_t first = lane_bytes * lane;
      const int64_t c0 = first / chunk * chunk;  // the lane's chunk
      // A lane lies inside one block (both layouts keep blocks whole), or past a W8 row's end
      // half-way through a 64-byte chunk.
      const int64_t first_column = c0 + column_of_byte(nibble_split, chunk, first - c0);
      lane_scales[lane] = first_column < cols ? sx[first_column / kActivationBlock] : 0.0f;
      if (nibble_split) {
        for (int64_t i = first - c0; i < first - c0 + lane_bytes; ++i) {
          q[c0 + i] = quantized[c0 + column_of_byte(true, chunk, i)];
        }
      }
      if (lane_offsets != nullptr) {
        float sum = 0.0f;
        for (int64_t i = first; i < first + lane_bytes && i < cols; ++i) sum += q[i];
        lane_offsets[lane] = lane_offset * lane_scales[lane] * sum;
      }
    }
    if (token_offset) {
      float total = 0.0f;
      for (int64_t b = 0; b < n_blocks; ++b) {
        int32_t sum = 0;
        for (int64_t c = b * kActivationBlock; c < (b + 1) * kActivationBlock; ++c) {
          sum += quantized[c];
        }
        total += sx[b] * static_cast<float>(sum);
      }
      a.token_offsets[t] = total;
    }
  };
  if (n_tokens >= 4 && kernel_pool().size() > 1) {
    kernel_pool().run(n_tokens, prepare);
  } else {
    for (int64_t t = 0; t < n_tokens; ++t) prepare(t);
  }
}

}  // namespace qhx
