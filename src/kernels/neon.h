// The aarch64 NEON kernels, internal to src/kernels: matmul.cc and attention.cc split the work
// over the threads and call these for their share; matmul_int8.cc calls matmul_int8. NEON is part
// of the aarch64 baseline, so only the optional dot-product instructions are checked at run time.
#pragma once

#include <cstdint>

#include "kernels/kernels.h"

namespace qhx {
class CpuContext;
}

namespace qhx::neon {

// Rows [row_begin, row_end) of y = x · wᵀ (shapes as kernels/matmul.h matmul). Each output's
// arithmetic is the same whatever n_tokens, so a token computed alone gets the same bits.
void matmul_rows(const float* x, int64_t n_tokens, const MatrixRef& w, float* y, int64_t row_begin,
                 int64_t row_end);

// True when this CPU has the ARMv8.2 dot-product instructions (SDOT) and these kernels were built
// able to use them (defined in matmul_int8_neon.cc; CpuKernels::detect asks).
bool dotprod_available();

// kernels/matmul_int8.h's matmul_int8 on the NEON integer kernels (those with SDOT where
// cx.kernels().neon_dotprod), over the threads of cx.
void matmul_int8(CpuContext& cx, const float* x, int64_t n_tokens, const MatrixRef& w, float* y);

// One query head q[head_dim] against keys and values rows 0..n_keys-1 (kv_stride floats apart),
// heads of type kv (core/kv_layout.h): out = softmax(scale · K q) · V. head_dim is a multiple of
// 4 (f32), 8 (f16, q8) or kKvQ4Group (q4), and at most kMaxQuantizedHeadDim unless f32; scores:
// scratch of n_keys floats. A quantized head is widened to float32 (scale · q) in registers, into
// a row on the stack, then read as an f32 one.
inline constexpr int64_t kMaxQuantizedHeadDim = 512;
void attend_query(KvType kv, const float* q, int64_t n_keys, const float* keys, const float* values,
                  int64_t kv_stride, int64_t head_dim, float scale, float* scores, float* out);

}  // namespace qhx::neon
