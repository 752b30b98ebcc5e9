// Compute kernels. They know tensors and shapes (core/tensor.h), never models. Every op has one
// scalar reference implementation here (namespace qhx::ref); fast variants are tested against it.
// All arithmetic is float32: F32, BF16 and F16 weights are widened exactly, W8 and W4 weights
// dequantised to float32(scale) · q.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace qhx {

// True when a matmul with w quantizes its activations: w asks for it, is W8 with cols a multiple
// of kActivationBlock, or W4 with group_size a multiple of 2·kActivationBlock (other layouts use
// float32 activations).
bool uses_int8_activations(const MatrixRef& w);

namespace ref {

// out[cols] = float32(w[row, :]), for W8 and W4 the float32 product scale · q.
void read_row(const MatrixRef& w, int64_t row, float* out);

// y[t, r] = Σ_c x[t, c] · w[r, c] for t < n_tokens (x: [n_tokens, w.cols], y: [n_tokens, w.rows]).
// Each output is summed in column order, so a row's result never depends on n_tokens.
// When uses_int8_activations(w), x is first quantized by quantize_activations and
//   y[t, r] = Σ_b sw(r, b) · sx(t, b) · Σ_{c ∈ block b} qw[r, c] · qx[t, c],
// the inner sums exact in integers, the outer one in float32 in block order; sw is the row's
// scale (W8) or the scale of the group holding block b (W4).
void matmul(const float* x, int64_t n_tokens, const MatrixRef& w, float* y);

// One token's activations as int8: per block b of kActivationBlock columns, with
// m = max|x| over the block, scales[b] = m / 127 and q = nearbyint(x · (127 / m)) (round to
// nearest even; so |q| ≤ 127), all in float32; an all-zero block gets scale 0 and q 0, and a
// block holding an inf or NaN gets scale NaN and q 0, so the NaN reaches every output it touches.
// cols is a multiple of kActivationBlock; q: [cols]; scales: [cols / kActivationBlock].
void quantize_activations(const float* x, int64_t cols, int8_t* q, float* scales);

// y = weight ⊙ (x / sqrt(mean(x²) + eps)) over n elements (y may alias x).
void rms_norm(const float* x, const float* weight, int64_t n, float eps, float* y);

// In place, for each of n_vectors vectors of length `stride`: rotate-half RoPE on the first
// rotary_dim elements, pairing i with i + rotary_dim/2; cos/sin hold rotary_dim/2 values.
void rope_rotate_half(float* x, int64_t n_vectors, int64_t stride, int64_t rotary_dim,
                      const float* cos, const float* sin);

// out[i] = silu(gate[i]) · up[i].
void silu_mul(const float* gate, const float* up, int64_t n, float* out);

// In place, numerically stable (max subtracted).
void softmax(float* x, int64_t n);

// Causal GQA attention for n_queries consecutive positions first_pos, first_pos+1, ...
// q: [n_queries, n_heads·head_dim]; keys/values: [first_pos + n_queries, shape.kv_row_floats()],
// rows of type shape.kv (all positions so far, cached ones included), each element read back as
// kv_load_head reads it. Query t sees keys 0..first_pos+t.
// out: [n_queries, n_heads·head_dim]; scores: scratch of first_pos + n_queries floats.
void causal_attention(const float* q, int64_t n_queries, int64_t first_pos, const float* keys,
                      const float* values, const AttentionShape& shape, float scale, float* out,
                      float* scores);

// y = (x − mean) / sqrt(var + eps) · weight + bias over n elements (y may alias x), the mean
// and the (biased) variance in float32 as torch.nn.LayerNorm computes them on the CPU.
void layer_norm(const float* x, const float* weight, const float* bias, int64_t n, float eps,
                float* y);

// In place: x · Φ(x) = x/2 · (1 + erf(x/√2)) (torch.nn.GELU), and its tanh approximation
// x/2 · (1 + tanh(√(2/π) (x + 0.044715 x³))) (gelu_pytorch_tanh).
void gelu(float* x, int64_t n);
void gelu_tanh(float* x, int64_t n);

// Attention of every query over all n_rows keys and values (no mask, no cache; heads as
// `shape`, its kv heads shared by groups of query heads). q, out: [n_rows, n_heads·head_dim];
// keys, values: [n_rows, n_kv_heads·head_dim]; scores: scratch of n_rows floats.
void bidirectional_attention(const float* q, int64_t n_rows, const float* keys, const float* values,
                             const AttentionShape& shape, float scale, float* out, float* scores);

// x[i] *= sigmoid(gate[i]).
void sigmoid_gate(const float* gate, int64_t n, float* x);

// In place: x / sqrt(Σ x² + eps) (eps on the sum, as Hugging Face's l2norm).
void l2_normalize(float* x, int64_t n, float eps);

// Depthwise causal conv1d over time followed by SiLU, continuing from `state`.
// u: [n_tokens, channels] inputs; weight: [channels, kernel] (weight[c, kernel-1] multiplies the
// current token); state: [kernel-1, channels], the previous inputs, oldest first (zeros at the
// start of a sequence), updated to the last kernel-1 inputs. out: [n_tokens, channels].
void causal_conv1d_silu(const float* u, int64_t n_tokens, int64_t channels, const float* weight,
                        int64_t kernel, float* state, float* out);

// The gated delta rule over n_tokens, continuing from `state` [n_v_heads, k_dim, v_dim] (f32,
// key index first), which is updated. Per token t and value head j, with α = exp(g):
//   S ← α S;  S ← S + k (β (v − Sᵀk))ᵀ;  o = Sᵀ q.
// q, k: [n_tokens, n_k_heads·k_dim] (already L2-normalised, q scaled); v, out:
// [n_tokens, n_v_heads·v_dim]; beta, g: [n_tokens, n_v_heads].
// Token by token, as the definition reads:
void gated_delta_rule_recurrent(const float* q, const float* k, const float* v, const float* beta,
                                const float* g, int64_t n_tokens, const DeltaRuleShape& shape,
                                float* state, float* out);
// The same in chunks of `chunk` tokens (WY/UT form, spec §3.7 step 7'): equal up to rounding.
void gated_delta_rule_chunked(const float* q, const float* k, const float* v, const float* beta,
                              const float* g, int64_t n_tokens, const DeltaRuleShape& shape,
                              int64_t chunk, float* state, float* out);

}  // namespace ref
}  // namespace qhx
