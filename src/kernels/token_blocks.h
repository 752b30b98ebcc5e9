// How the float-activation matmuls walk their rows (internal to src/kernels): each row is read
// once from memory and used for every token while it is in cache, kTokenBlock tokens sharing
// each weight load, the leftover tokens one at a time. Each token's arithmetic is the same in a
// block or alone, so a token decoded alone gets the bits it gets inside a batched prefill.
#pragma once

#include <cstdint>

#include "kernels/kernels.h"

namespace qhx {

// Rows [row_begin, row_end) of y = x · wᵀ; dot_row.template operator()<NT>(r, xs, out) writes
// row r's dot products with the NT token rows xs into out[0..NT).
template <int kTokenBlock, typename DotRow>
inline void rows_by_token_blocks(const float* x, int64_t n_tokens, const MatrixRef& w, float* y,
                                 int64_t row_begin, int64_t row_end, const DotRow& dot_row) {
  for (int64_t r = row_begin; r < row_end; ++r) {
    int64_t t = 0;
    for (; t + kTokenBlock <= n_tokens; t += kTokenBlock) {
      const float* xs[kTokenBlock];
      float out[kTokenBlock];
      for (int i = 0; i < kTokenBlock; ++i) xs[i] = x + (t + i) * w.cols;
      dot_row.template operator()<kTokenBlock>(r, xs, out);
      for (int i = 0; i < kTokenBlock; ++i) y[(t + i) * w.rows + r] = out[i];
    }
    for (; t < n_tokens; ++t) {
      const float* xs[1] = {x + t * w.cols};
      dot_row.template operator()<1>(r, xs, &y[t * w.rows + r]);
    }
  }
}

}  // namespace qhx
