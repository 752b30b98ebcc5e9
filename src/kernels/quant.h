// Narrowing conversions and weight quantisers, used when writing qhx bundles. The layouts they
// produce are the MatrixRef formats of kernels/kernels.h.
#pragma once

#include <cstdint>

#include "io/dtype.h"

namespace qhx {

// float32 → bfloat16 / IEEE half bits, rounding to nearest, ties to even. NaN stays NaN (quiet,
// sign and leading payload bits kept); past the largest finite value rounds to ±inf; f16
// subnormals are exact; ±0 keep their sign.
uint16_t f32_to_bf16(float x);
uint16_t f32_to_f16(float x);

// Bytes of the data part and of the scales of a [rows, cols] matrix stored as `dtype`: plain
// types have no scales, W8 one f32 per row, W4 one f16 per group. group_size must be 0 except
// for W4, where it is positive, even and divides cols. Throws Error on an impossible layout.
uint64_t matrix_bytes(DType dtype, int64_t rows, int64_t cols, int64_t group_size);
uint64_t matrix_scale_bytes(DType dtype, int64_t rows, int64_t cols, int64_t group_size);

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
