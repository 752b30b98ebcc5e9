// Fast norms, rotary embedding, gates and the causal conv, on the kernels of a CPU context (AVX2 +
// FMA; otherwise the scalar references). Each has the arguments
// and meaning of its ref:: namesake in kernels/kernels.h. Every element is computed the same way
// wherever it lies in the arrays (the vector tail runs the same arithmetic, masked), so a token
// processed alone gets exactly what it gets inside a batch.
#pragma once

#include <cstdint>

namespace qhx {

class CpuContext;

// y = weight ⊙ (x / sqrt(mean(x²) + eps)) over n elements (y may alias x).
void rms_norm(CpuContext& cx, const float* x, const float* weight, int64_t n, float eps, float* y);
// rms_norm of each of n_rows consecutive rows of n elements, rows spread over the threads of cx.
void rms_norm_rows(CpuContext& cx, const float* x, const float* weight, int64_t n_rows, int64_t n,
                   float eps, float* y);

// The residual add and the next norm in one pass: h += y, then x = rms_norm(h), row by row, rows
// spread over the threads of cx.
void add_rms_norm_rows(CpuContext& cx, float* h, const float* y, const float* weight,
                       int64_t n_rows, int64_t n, float eps, float* x);

// In place, rotate-half RoPE on the first rotary_dim elements of each of n_vectors vectors.
void rope_rotate_half(CpuContext& cx, float* x, int64_t n_vectors, int64_t stride,
                      int64_t rotary_dim, const float* cos, const float* sin);

// out[i] = silu(gate[i]) · up[i] (out may alias gate or up). This and sigmoid_gate spread long
// arrays over the threads of cx.
void silu_mul(CpuContext& cx, const float* gate, const float* up, int64_t n, float* out);

// x[i] *= sigmoid(gate[i]).
void sigmoid_gate(CpuContext& cx, const float* gate, int64_t n, float* x);

// In place: x / sqrt(Σ x² + eps).
void l2_normalize(CpuContext& cx, float* x, int64_t n, float eps);

// Depthwise causal conv1d over time then SiLU, continuing from and updating `state`
// ([kernel-1, channels], oldest first); weight: [channels, kernel].
void causal_conv1d_silu(CpuContext& cx, const float* u, int64_t n_tokens, int64_t channels,
                        const float* weight, int64_t kernel, float* state, float* out);

}  // namespace qhx
