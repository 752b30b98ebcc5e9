// The fast matmul: y = x · wᵀ for every weight dtype, on the kernels a CPU context chose for its
// CPU (kernels/cpu_context.h; kernels/kernels.h defines MatrixRef and the scalar reference,
// ref::matmul, that it is tested against). Each output is one dot product computed the same way
// whatever n_tokens is, so a token decoded alone gets exactly the logits it gets inside a batched
// prefill.
#pragma once

#include <cstdint>
#include <initializer_list>

#include "kernels/kernels.h"

namespace qhx {

class CpuContext;

// y[t, r] = Σ_c x[t, c] · w[r, c] for t < n_tokens (x: [n_tokens, w.cols], y: [n_tokens, w.rows]),
// on the context's threads with its kernels.
void matmul(CpuContext& cx, const float* x, int64_t n_tokens, const MatrixRef& w, float* y);

// y = x · wᵀ for each {w, y}, bitwise as one matmul() each: a layer's projections of one input
// (q/k/v, gate/up). Where they share an int8 layout (same dtype, columns and packing), x is
// quantized once and all their rows are one job for the threads.
void matmul(CpuContext& cx, const float* x, int64_t n_tokens,
            std::initializer_list<MatmulOutput> outputs);

}  // namespace qhx
