#include "kernels/delta_rule.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu_context.h"
#include "kernels/matmul.h"
#include "kernels/simd_avx2.h"

namespace qhx {

#if defined(__x86_64__)
namespace {

using avx2::FullBlock;
using avx2::PartialBlock;

struct DeltaRuleArgs {
  const float *q, *k, *v, *beta, *g;
  int64_t n_tokens;
  DeltaRuleShape shape;
  float* state;
  float* out;
};

int64_t round_up8(int64_t n) {
  return (n + 7) / 8 * 8;
}

// ---- Recurrent ----

constexpr int64_t kColumnBlock = 32;  // state columns per recurrent task: four vectors

// The recurrence on columns [c0, c0 + 8·NV) of value head j's state S [dk, dv], token by token:
// m = α·Sᵀk, δ = β(v − m), S ← αS + kδᵀ, o = Sᵀq (the decay folded into the read: αSᵀk).
// `last` moves the block's last vector (PartialBlock where it ends the row short of 8 columns).
template <int NV, typename Last>
QHX_TARGET_AVX2 void recurrent_columns(const DeltaRuleArgs& a, int64_t j, int64_t c0, Last last) {
  const DeltaRuleShape& s = a.shape;
  const int64_t dk = s.k_dim, dv = s.v_dim, kh = j / (s.n_v_heads / s.n_k_heads);
  const auto load = [&](const float* p, int i) QHX_TARGET_AVX2 {
    if (i == NV - 1) return last.load(p);
    return _mm256_loadu_ps(p);
  };
  const auto store = [&](float* p, __m256 x, int i) QHX_TARGET_AVX2 {
    if (i == NV - 1) return last.store(p, x);
    _mm256_storeu_ps(p, x);
  };
  float* S = a.state + j * dk * dv + c0;
  for (int64_t t = 0; t < a.n_tokens; ++t) {
    const float* qt = a.q + (t * s.n_k_heads + kh) * dk;
    const float* kt = a.k + (t * s.n_k_heads + kh) * dk;
    const float* vt = a.v + (t * s.n_v_heads + j) * dv + c0;
    float* ot = a.out + (t * s.n_v_heads + j) * dv + c0;
    const __m256 alpha = _mm256_set1_ps(std::exp(a.g[t * s.n_v_heads + j]));
    const __m256 beta = _mm256_set1_ps(a.beta[t * s.n_v_heads + j]);
    __m256 m[NV], delta[NV], o[NV];
    for (int i = 0; i < NV; ++i) m[i] = o[i] = _mm256_setzero_ps();
    for (int64_t r = 0; r < dk; ++r) {
      const __m256 kr = _mm256_set1_ps(kt[r]);
      for (int i = 0; i < NV; ++i) m[i] = _mm256_fmadd_ps(load(S + r * dv + 8 * i, i), kr, m[i]);
    }
    for (int i = 0; i < NV; ++i) {
      delta[i] = _mm256_mul_ps(beta, _mm256_fnmadd_ps(alpha, m[i], load(vt + 8 * i, i)));
    }
    for (int64_t r = 0; r < dk; ++r) {
      const __m256 kr = _mm256_set1_ps(kt[r]), qr = _mm256_set1_ps(qt[r]);
      for (int i = 0; i < NV; ++i) {
        float* p = S + r * dv + 8 * i;
        const __m256 updated = _mm256_fmadd_ps(kr, delta[i], _mm256_mul_ps(alpha, load(p, i)));
        store(p, updated, i);
        o[i] = _mm256_fmadd_ps(qr, updated, o[i]);
      }
    }
    for (int i = 0; i < NV; ++i) store(ot + 8 * i, o[i], i);
  }
}

// Columns [c0, c0 + kColumnBlock) of head j, cut short at the end of the row.
QHX_TARGET_AVX2 void recurrent_block(const DeltaRuleArgs& a, int64_t j, int64_t c0) {
  const int64_t dv = a.shape.v_dim;
  if (c0 + kColumnBlock <= dv) return recurrent_columns<kColumnBlock / 8>(a, j, c0, FullBlock{});
  for (int64_t c = c0; c < dv; c += 8) {
    if (c + 8 <= dv) {
      recurrent_columns<1>(a, j, c, FullBlock{});
    } else {
      recurrent_columns<1>(a, j, c, PartialBlock{avx2::first_lanes(dv - c)});
    }
  }
}

// ---- Chunked ----

// C ±= X·B on one MR × 8·NV tile of C; the rows of X, B and C are ldx, ldb and ldc floats apart.
template <int MR, int NV, bool kSubtract>
QHX_TARGET_AVX2 inline void gemm_tile(int64_t depth, const float* x, int64_t ldx, const float* b,
                                      int64_t ldb, float* c, int64_t ldc) {
  __m256 acc[MR][NV];
  for (int r = 0; r < MR; ++r) {
    for (int i = 0; i < NV; ++i) acc[r][i] = _mm256_loadu_ps(c + r * ldc + 8 * i);
  }
  for (int64_t d = 0; d < depth; ++d) {
    __m256 bd[NV];
    for (int i = 0; i < NV; ++i) bd[i] = _mm256_loadu_ps(b + d * ldb + 8 * i);
    for (int r = 0; r < MR; ++r) {
      const __m256 xr = _mm256_set1_ps(x[r * ldx + d]);
      for (int i = 0; i < NV; ++i) {
        acc[r][i] = kSubtract ? _mm256_fnmadd_ps(xr, bd[i], acc[r][i])
                              : _mm256_fmadd_ps(xr, bd[i], acc[r][i]);
      }
    }
  }
  for (int r = 0; r < MR; ++r) {
    for (int i = 0; i < NV; ++i) _mm256_storeu_ps(c + r * ldc + 8 * i, acc[r][i]);
  }
}

template <int MR, bool kSubtract>
QHX_TARGET_AVX2 void gemm_rows(int64_t depth, int64_t width, const float* x, int64_t ldx,
                               const float* b, int64_t ldb, float* c, int64_t ldc) {
  int64_t col = 0;
  for (; col + 16 <= width; col += 16) {
    gemm_tile<MR, 2, kSubtract>(depth, x, ldx, b + col, ldb, c + col, ldc);
  }
  if (col < width) gemm_tile<MR, 1, kSubtract>(depth, x, ldx, b + col, ldb, c + col, ldc);
}

// C[rows, width] ±= X[rows, depth] · B[depth, width], width a multiple of 8.
template <bool kSubtract>
QHX_TARGET_AVX2 void gemm(int64_t rows, int64_t depth, int64_t width, const float* x, int64_t ldx,
                          const float* b, int64_t ldb, float* c, int64_t ldc) {
  int64_t r = 0;
  for (; r + 4 <= rows; r += 4) {
    gemm_rows<4, kSubtract>(depth, width, x + r * ldx, ldx, b, ldb, c + r * ldc, ldc);
  }
  for (; r < rows; ++r)
    gemm_rows<1, kSubtract>(depth, width, x + r * ldx, ldx, b, ldb, c + r * ldc, ldc);
}

constexpr int64_t kRowBlock = 4;  // rows of the triangular steps done together: one tile high

// A thread's working arrays for chunked_head.
struct ChunkScratch {
  std::vector<float> S, keys_t, gram, UW, O, diff;
  std::vector<double> G;
};

// Value head j, chunk by chunk. Row widths are rounded up to whole vectors (zero columns, which
// stay zero), so the products need no tails; the state is copied in and out once per call.
QHX_TARGET_AVX2 void chunked_head(const DeltaRuleArgs& a, int64_t chunk, int64_t j,
                                  ChunkScratch& scratch) {
  const DeltaRuleShape& s = a.shape;
  const int64_t dk = s.k_dim, dv = s.v_dim, hk = s.n_k_heads, hv = s.n_v_heads;
  const int64_t kh = j / (hv / hk), dvp = round_up8(dv), dkp = round_up8(dk);
  const int64_t uw = dvp + dkp;  // a row of [U | W]
  const int64_t max_n = std::min(chunk, a.n_tokens), max_np = round_up8(max_n);
  auto& [S, keys_t, gram, UW, O, diff, G] = scratch;
  S.assign(dk * dvp, 0.0f);
  keys_t.resize(dk * max_np);
  gram.resize(2 * max_n * max_np);
  UW.resize(max_n * uw);
  O.resize(max_n * dvp);
  diff.resize(max_np);
  G.resize(max_n);
  float* stored = a.state + j * dk * dv;
  for (int64_t r = 0; r < dk; ++r) std::copy_n(stored + r * dv, dv, S.data() + r * dvp);

  for (int64_t start = 0; start < a.n_tokens; start += chunk) {
    const int64_t n = std::min(chunk, a.n_tokens - start), np = round_up8(n);
    const int64_t x_row = hk * dk;  // q and k rows of consecutive tokens
    const float* qc = a.q + (start * hk + kh) * dk;
    const float* kc = a.k + (start * hk + kh) * dk;
    const auto beta_at = [&](int64_t i) { return a.beta[(start + i) * hv + j]; };
    // Cumulative log-decay in double: its differences set every decay weight.
    double cumulative = 0.0;
    for (int64_t i = 0; i < n; ++i) G[i] = cumulative += a.g[(start + i) * hv + j];

    // Gram rows [0, n): k_i·k_p; rows [n, 2n): q_i·k_p; each row block only up to its diagonal.
    std::fill(keys_t.begin(), keys_t.end(), 0.0f);
    for (int64_t p = 0; p < n; ++p) {
      for (int64_t r = 0; r < dk; ++r) keys_t[r * np + p] = kc[p * x_row + r];
    }
    float* KK = gram.data();
    float* QK = gram.data() + n * np;
    std::fill(gram.begin(), gram.begin() + 2 * n * np, 0.0f);
    for (int64_t i0 = 0; i0 < n; i0 += kRowBlock) {
      const int64_t rows = std::min(kRowBlock, n - i0), width = std::min(np, round_up8(i0 + rows));
      gemm<false>(rows, dk, width, kc + i0 * x_row, x_row, keys_t.data(), np, KK + i0 * np, np);
      gemm<false>(rows, dk, width, qc + i0 * x_row, x_row, keys_t.data(), np, QK + i0 * np, np);
    }
    // In place: A[i,p] = β_i (k_i·k_p) e^{G_i−G_p} (read for p < i) and
    // P[i,p] = (q_i·k_p) e^{G_i−G_p} for p ≤ i, zero beyond.
    float* A = KK;
    float* P = QK;
    float* const exponents = diff.data();  // a lambda may not capture a structured binding
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t p = 0; p <= i; ++p) exponents[p] = static_cast<float>(G[i] - G[p]);
      const __m256 beta = _mm256_set1_ps(beta_at(i));
      float* a_row = A + i * np;
      float* p_row = P + i * np;
      avx2::for_each_block(i + 1, [&](int64_t p, auto block) QHX_TARGET_AVX2 {
        const __m256 decay = avx2::exp(block.load(exponents + p));
        block.store(a_row + p, _mm256_mul_ps(beta, _mm256_mul_ps(block.load(a_row + p), decay)));
        block.store(p_row + p, _mm256_mul_ps(block.load(p_row + p), decay));
      });
      std::fill(p_row + i + 1, p_row + np, 0.0f);
    }

    // Right-hand sides [βv | β e^G k], then (I + A)[U | W] = them by forward substitution in
    // row blocks: the rows above a block as one product, then the block's own triangle.
    std::fill(UW.begin(), UW.begin() + n * uw, 0.0f);
    for (int64_t i = 0; i < n; ++i) {
      const float* vi = a.v + ((start + i) * hv + j) * dv;
      const float b = beta_at(i), bw = b * static_cast<float>(std::exp(G[i]));
      for (int64_t c = 0; c < dv; ++c) UW[i * uw + c] = b * vi[c];
      for (int64_t c = 0; c < dk; ++c) UW[i * uw + dvp + c] = bw * kc[i * x_row + c];
    }
    for (int64_t i0 = 0; i0 < n; i0 += kRowBlock) {
      const int64_t rows = std::min(kRowBlock, n - i0);
      gemm<true>(rows, i0, uw, A + i0 * np, np, UW.data(), uw, UW.data() + i0 * uw, uw);
      for (int64_t i = i0 + 1; i < i0 + rows; ++i) {
        gemm<true>(1, i - i0, uw, A + i * np + i0, np, UW.data() + i0 * uw, uw, UW.data() + i * uw,
                   uw);
      }
    }
    // V' = U − W S, held in U.
    gemm<true>(n, dk, dvp, UW.data() + dvp, uw, S.data(), dvp, UW.data(), uw);

    // o_i = e^{G_i} Sᵀq_i + Σ_{p≤i} P[i,p] V'_p, with S the incoming state.
    std::fill(O.begin(), O.begin() + n * dvp, 0.0f);
    gemm<false>(n, dk, dvp, qc, x_row, S.data(), dvp, O.data(), dvp);
    for (int64_t i = 0; i < n; ++i) {
      const float decay = static_cast<float>(std::exp(G[i]));
      for (int64_t c = 0; c < dvp; ++c) O[i * dvp + c] *= decay;
    }
    for (int64_t i0 = 0; i0 < n; i0 += kRowBlock) {
      const int64_t rows = std::min(kRowBlock, n - i0);
      gemm<false>(rows, i0 + rows, dvp, P + i0 * np, np, UW.data(), uw, O.data() + i0 * dvp, dvp);
    }
    for (int64_t i = 0; i < n; ++i) {
      std::copy_n(O.data() + i * dvp, dv, a.out + ((start + i) * hv + j) * dv);
    }

    // S ← e^{G_n} S + Σ_p e^{G_n−G_p} k_p V'_pᵀ (the keys' transpose weighted in place).
    const float last = static_cast<float>(std::exp(G[n - 1]));
    for (float& x : S) x *= last;
    for (int64_t p = 0; p < n; ++p) {
      const float w = static_cast<float>(std::exp(G[n - 1] - G[p]));
      for (int64_t r = 0; r < dk; ++r) keys_t[r * np + p] *= w;
    }
    gemm<false>(dk, n, dvp, keys_t.data(), np, UW.data(), uw, S.data(), dvp);
  }
  for (int64_t r = 0; r < dk; ++r) std::copy_n(S.data() + r * dvp, dv, stored + r * dv);
}

}  // namespace
#endif

void gated_delta_rule_recurrent([[maybe_unused]] CpuContext& cx, const float* q, const float* k,
                                const float* v, const float* beta, const float* g, int64_t n_tokens,
                                const DeltaRuleShape& shape, float* state, float* out) {
#if defined(__x86_64__)
  if (cx.kernels().avx2) {
    const DeltaRuleArgs args{q, k, v, beta, g, n_tokens, shape, state, out};
    const int64_t blocks = (shape.v_dim + kColumnBlock - 1) / kColumnBlock;
    cx.run(shape.n_v_heads * blocks, [&](int64_t task, Scratch&) {
      recurrent_block(args, task / blocks, task % blocks * kColumnBlock);
    });
    return;
  }
#endif
  ref::gated_delta_rule_recurrent(q, k, v, beta, g, n_tokens, shape, state, out);
}

void gated_delta_rule_chunked([[maybe_unused]] CpuContext& cx, const float* q, const float* k,
                              const float* v, const float* beta, const float* g, int64_t n_tokens,
                              const DeltaRuleShape& shape, int64_t chunk, float* state,
                              float* out) {
#if defined(__x86_64__)
  if (cx.kernels().avx2) {
    if (n_tokens == 0) return;
    const DeltaRuleArgs args{q, k, v, beta, g, n_tokens, shape, state, out};
    cx.run(shape.n_v_heads, [&](int64_t j, Scratch& scratch) {
      chunked_head(args, chunk, j, scratch.object<ChunkScratch>(Scratch::kDeltaRule));
    });
    return;
  }
#endif
  ref::gated_delta_rule_chunked(q, k, v, beta, g, n_tokens, shape, chunk, state, out);
}

}  // namespace qhx
