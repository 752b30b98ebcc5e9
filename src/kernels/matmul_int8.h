// The W8/W4 matmul with int8 activations (the arithmetic ref::matmul defines for a matrix where
// uses_int8_activations(w)), on the fastest integer kernels this CPU runs. kernels/matmul.h's
// matmul() dispatches here; it is separate so each can be tested against the reference.
#pragma once

#include <cstdint>

#include "kernels/kernels.h"

namespace qhx {

// Requires uses_int8_activations(w). x: [n_tokens, w.cols]; y: [n_tokens, w.rows].
void matmul_int8(const float* x, int64_t n_tokens, const MatrixRef& w, float* y);

// "avx512-vnni", "avx2" (x86-64), "neon-dotprod", "neon" (aarch64, with and without the ARMv8.2
// dot-product instructions) or "scalar reference". QHX_KERNELS=avx2 (x86-64) or =neon (aarch64)
// keeps to the second; =reference forces the last.
const char* matmul_int8_kernel_path();

namespace simd {
// True when this CPU runs the AVX-512 VNNI int8 kernels and QHX_KERNELS (=reference or =avx2)
// does not forbid them.
bool has_avx512_vnni();
}  // namespace simd

}  // namespace qhx
