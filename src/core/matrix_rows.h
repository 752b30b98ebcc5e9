// Some rows of a weight matrix, copied in the matrix's own format (core/tensor.h), as a matrix of
// their own: a narrower lm_head for drafting over a subset of the vocabulary (io/draft_vocab.h).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/tensor.h"

namespace qhx {

class MatrixRows {
 public:
  // Row i is w's row rows[i] (each within [0, w.rows): the caller checks). w's bytes must be
  // readable where they lie. `matrix.buffer` is null: a backend packing it keeps these bytes
  // (it releases only the pages of mapped files).
  MatrixRows(const MatrixRef& w, std::span<const int32_t> rows);
  MatrixRows(MatrixRows&&) = default;  // the vectors' storage, and so `matrix`, stays put
  MatrixRows& operator=(MatrixRows&&) = default;
  MatrixRows(const MatrixRows&) = delete;
  MatrixRows& operator=(const MatrixRows&) = delete;

  MatrixRef matrix;  // into data_ and scales_; w's dtype, group size and activations

 private:
  std::vector<uint8_t> data_, scales_;
};

}  // namespace qhx
