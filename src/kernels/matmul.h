// The fast matmul: y = x · wᵀ for every weight dtype, picked at run time for the CPU it runs on
// (kernels/kernels.h defines MatrixRef and the scalar reference, ref::matmul, that it is tested
// against). Each output is one dot product computed the same way whatever n_tokens is, so a token
// decoded alone gets exactly the logits it gets inside a batched prefill.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string_view>

#include "kernels/kernels.h"

namespace qhx {

// y[t, r] = Σ_c x[t, c] · w[r, c] for t < n_tokens (x: [n_tokens, w.cols], y: [n_tokens, w.rows]),
// on kernel_threads() threads (kernels/thread_pool.h).
void matmul(const float* x, int64_t n_tokens, const MatrixRef& w, float* y);

// y = x · wᵀ for each {w, y}, bitwise as one matmul() each: a layer's projections of one input
// (q/k/v, gate/up). Where they share an int8 layout (same dtype, columns and packing), x is
// quantized once and all their rows are one job for the threads.
void matmul(const float* x, int64_t n_tokens, std::initializer_list<MatmulOutput> outputs);

// The implementations matmul uses here: "avx2+fma, int8 avx512-vnni" or "avx2+fma, int8 avx2"
// (x86-64 CPUs that have them: float activations, then int8 ones), "neon" (aarch64) or "scalar
// reference" (also forced by the environment variable QHX_KERNELS=reference).
const char* matmul_kernel_path();

namespace simd {
// True when the environment variable QHX_KERNELS names this choice: "reference" (the scalar
// kernels), "avx2" (x86-64: no AVX-512) or "neon" (aarch64: no dot-product instructions), to
// compare speeds or run a second-best path on a CPU that has the best.
bool kernels_requested(std::string_view choice);
// True when this CPU runs the AVX2 + FMA + F16C kernels (and QHX_KERNELS does not forbid them).
bool has_avx2();
// True when it also has AVX-512 F/BW/DQ/VL and QHX_KERNELS=avx2 does not keep to AVX2.
bool has_avx512();
}  // namespace simd

}  // namespace qhx
