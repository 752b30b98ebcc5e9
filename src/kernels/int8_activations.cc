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
  auto prepare = [&](int64_t t) {
    thread_local std::vector<int8_t> natural;
    thread_local std::vector<float> block_scales;
    natural.resize(cols);
    block_scales.resize(n_blocks);
    const int8_t* qn = natural.data();
    const float* sx = block_scales.data();
    quantize(x + t * cols, cols, natural.data(), block_scales.data());
    int8_t* q = a.q.data() + t * cols;
    for (int64_t lane = 0; lane < a.lanes; ++lane) {
      const int64_t first = lane_bytes * lane;
      const int64_t c0 = first / chunk * chunk;  // the lane's chunk
      float scale = 0.0f, sum = 0.0f;
      for (int64_t i = first - c0; i < first - c0 + lane_bytes; ++i) {
        const int64_t c = c0 + column_of_byte(nibble_split, chunk, i);
        if (c >= cols) break;  // a W8 row ending half-way through a 64-byte chunk
        q[c0 + i] = qn[c];
        scale = sx[c / kActivationBlock];
        sum += static_cast<float>(qn[c]);
      }
      a.lane_scales[t * a.lanes + lane] = scale;
      if (lane_offset != 0.0f) a.lane_offsets[t * a.lanes + lane] = lane_offset * scale * sum;
    }
    if (token_offset) {
      float total = 0.0f;
      for (int64_t b = 0; b < n_blocks; ++b) {
        int32_t sum = 0;
        for (int64_t c = b * kActivationBlock; c < (b + 1) * kActivationBlock; ++c) sum += qn[c];
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
