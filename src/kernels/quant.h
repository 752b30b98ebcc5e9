// Weight quantisers, used when writing qhx bundles. The layouts they produce are the MatrixRef
// formats of core/tensor.h (their sizes: matrix_bytes in core/dtype.h).
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace qhx {

// Symmetric per-row int8: scales[r] = max|w[r, :]| / 127, q = clamp(round(w / scale), ±127),
// rounding to nearest even (std::nearbyint in the default mode). A row whose scale is 0 (all
// zero, or so tiny the division underflows) gets q 0. q: [rows, cols]; scales: [rows]. Throws
// Error on a non-finite weight.
void quantize_w8(const float* w, int64_t rows, int64_t cols, int8_t* q, float* scales);

// Symmetric int4 per group of group_size columns: the scale max|group| / 7 is rounded to f16
// first and q = clamp(round(w / scale), ±7) uses that rounded scale, so the stored scale is the
// one q was made for. A group whose scale rounds to 0 (all zero, or max|w| ≤ about 7 · 2^-25)
// gets q 0. packed: [rows, cols/2] bytes; scales: f16 bits [rows, cols/group_size]. Throws
// Error on a bad layout, a non-finite weight, or a group whose scale overflows f16.
void quantize_w4(const float* w, int64_t rows, int64_t cols, int64_t group_size, uint8_t* packed,
                 uint16_t* scales);

}  // namespace qhx
