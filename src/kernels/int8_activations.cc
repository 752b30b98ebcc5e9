#include "kernels/int8_activations.h"

#include "kernels/thread_pool.h"

namespace qhx {
namespace {

// The column of kernel byte i within each chunk of a nibble-split token: the chunk's even
// columns, then its odd ones, matching weights unpacked as all low nibbles then all high ones.
int64_t column_of_byte(int64_t chunk, int64_t i) {
  const int64_t half = chunk / 2;
  return i < half ? 2 * i : 2 * (i - half) + 1;
}

}  // namespace

void prepare_activations(QuantizeToken quantize, const float* x, int64_t n_tokens, int64_t cols,
                         int64_t chunk, bool nibble_split, float lane_offset, bool token_offset,
                         Int8Activations& a) {
  const int64_t n_blocks = cols / kActivationBlock;
  a.cols = cols;
  a.q.resize(n_tokens * cols);
  a.block_stride = n_blocks + 16;
  a.block_scales.assign(n_tokens * a.block_stride, 0.0f);
  a.lanes = lane_offset != 0.0f ? cols / 4 : 0;
  a.lane_offsets.resize(n_tokens * a.lanes);
  a.token_offsets.resize(token_offset ? n_tokens : 0);
  auto prepare = [&](int64_t t) {
    thread_local std::vector<int8_t> split;
    float* sx = a.block_scales.data() + t * a.block_stride;
    int8_t* q = a.q.data() + t * cols;
    // Quantized in place when the kernel reads the columns in order; else reordered from a copy.
    int8_t* quantized = q;
    if (nibble_split) {
      split.resize(cols);
      quantized = split.data();
    }
    quantize(x + t * cols, cols, quantized, sx);
    if (nibble_split) {
      for (int64_t c0 = 0; c0 < cols; c0 += chunk) {
        for (int64_t i = 0; i < chunk; ++i) q[c0 + i] = quantized[c0 + column_of_byte(chunk, i)];
      }
    }
    // Both layouts keep each 4-byte lane inside one block.
    for (int64_t lane = 0; lane < a.lanes; ++lane) {
      const int64_t c0 = 4 * lane / chunk * chunk;
      const int64_t first_column =
          c0 + (nibble_split ? column_of_byte(chunk, 4 * lane - c0) : 4 * lane - c0);
      float sum = 0.0f;
      for (int64_t i = 4 * lane; i < 4 * lane + 4; ++i) sum += q[i];
      a.lane_offsets[t * a.lanes + lane] = lane_offset * sx[first_column / kActivationBlock] * sum;
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
