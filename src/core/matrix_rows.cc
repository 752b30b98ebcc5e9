#include "core/matrix_rows.h"

#include <cstring>

namespace qhx {

MatrixRows::MatrixRows(const MatrixRef& w, std::span<const int32_t> rows) {
  const uint64_t row_bytes = matrix_bytes(w.dtype, 1, w.cols, w.group_size);
  const uint64_t row_scale_bytes = matrix_scale_bytes(w.dtype, 1, w.cols, w.group_size);
  data_.resize(rows.size() * row_bytes);
  scales_.resize(rows.size() * row_scale_bytes);
  const auto* data = static_cast<const uint8_t*>(w.data);
  const auto* scales = static_cast<const uint8_t*>(w.scales);
  for (size_t i = 0; i < rows.size(); ++i) {
    std::memcpy(data_.data() + i * row_bytes, data + rows[i] * row_bytes, row_bytes);
    if (row_scale_bytes != 0) {
      std::memcpy(scales_.data() + i * row_scale_bytes, scales + rows[i] * row_scale_bytes,
                  row_scale_bytes);
    }
  }
  matrix = w;
  matrix.data = data_.data();
  matrix.scales = scales_.empty() ? nullptr : scales_.data();
  matrix.rows = static_cast<int64_t>(rows.size());
  matrix.packed = nullptr;
  matrix.buffer = nullptr;
}

}  // namespace qhx
