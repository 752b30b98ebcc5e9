// Fast grouped-query attention, causal and bidirectional (the scalar references are ref::'s in
// kernels/kernels.h, same arguments). Query rows and heads are spread over the context's threads;
// each (query, head) pair is computed the same way whatever the batch, so a token decoded alone
// gets exactly what it gets inside a batched prefill.
#pragma once

#include <cstdint>

#include "kernels/kernels.h"

namespace qhx {

class CpuContext;
struct CpuKernels;

// q: [n_queries, n_heads·head_dim]; keys/values: [first_pos + n_queries, shape.kv_row_floats()],
// rows of type shape.kv. Query t sees keys 0..first_pos+t. out: [n_queries, n_heads·head_dim].
// Quantized rows are read where they lie, codes widened in registers and each head's (group's)
// scale applied to its partial sum, so their attention reads a quarter (q8) of f32's bytes.
void causal_attention(CpuContext& cx, const float* q, int64_t n_queries, int64_t first_pos,
                      const float* keys, const float* values, const AttentionShape& shape,
                      float scale, float* out);

// Every query over all n_rows keys (ref::bidirectional_attention): blocks of queries share each
// key and value load, as in causal_attention. q, out: [n_rows, n_heads·head_dim].
void bidirectional_attention(CpuContext& cx, const float* q, int64_t n_rows, const float* keys,
                             const float* values, const AttentionShape& shape, float scale,
                             float* out);

// The implementation causal_attention uses with these kernels and KV rows: "avx512" (x86-64, f32
// rows, head_dim a multiple of 16), "avx2+fma" (x86-64, head_dim a multiple of 8), "neon"
// (aarch64) or "scalar reference".
const char* attention_kernel_path(const CpuKernels& kernels, int64_t head_dim,
                                  KvType kv = KvType::kF32);

}  // namespace qhx
