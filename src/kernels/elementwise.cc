#include "kernels/elementwise.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu_context.h"
#include "kernels/kernels.h"
#include "kernels/matmul.h"
#include "kernels/simd_avx2.h"

namespace qhx {

#if defined(__x86_64__)
namespace {

using avx2::for_each_block;

// 1 + e^−x: sigmoid(x) = 1 / it, silu(x) = x / it.
QHX_TARGET_AVX2 __m256 one_plus_exp_neg(__m256 x) {
  return _mm256_add_ps(_mm256_set1_ps(1.0f), avx2::exp(_mm256_sub_ps(_mm256_setzero_ps(), x)));
}

QHX_TARGET_AVX2 __m256 silu(__m256 x) {
  return _mm256_div_ps(x, one_plus_exp_neg(x));
}

QHX_TARGET_AVX2 float sum_of_squares(const float* x, int64_t n) {
  __m256 acc = _mm256_setzero_ps();
  for_each_block(n, [&](int64_t i, auto block) QHX_TARGET_AVX2 {
    const __m256 v = block.load(x + i);
    acc = _mm256_fmadd_ps(v, v, acc);
  });
  return avx2::horizontal_sum(acc);
}

QHX_TARGET_AVX2 void rms_norm_avx2(const float* x, const float* weight, int64_t n, float eps,
                                   float* y) {
  const float inv_rms = 1.0f / std::sqrt(sum_of_squares(x, n) / static_cast<float>(n) + eps);
  const __m256 s = _mm256_set1_ps(inv_rms);
  for_each_block(n, [&](int64_t i, auto block) QHX_TARGET_AVX2 {
    block.store(y + i, _mm256_mul_ps(block.load(weight + i), _mm256_mul_ps(block.load(x + i), s)));
  });
}

QHX_TARGET_AVX2 void rope_rotate_half_avx2(float* x, int64_t n_vectors, int64_t stride,
                                           int64_t rotary_dim, const float* cos, const float* sin) {
  const int64_t half = rotary_dim / 2;
  for (int64_t v = 0; v < n_vectors; ++v) {
    float* a = x + v * stride;
    float* b = a + half;
    for_each_block(half, [&](int64_t i, auto block) QHX_TARGET_AVX2 {
      const __m256 ai = block.load(a + i), bi = block.load(b + i);
      const __m256 c = block.load(cos + i), s = block.load(sin + i);
      block.store(a + i, _mm256_fmsub_ps(ai, c, _mm256_mul_ps(bi, s)));
      block.store(b + i, _mm256_fmadd_ps(bi, c, _mm256_mul_ps(ai, s)));
    });
  }
}

QHX_TARGET_AVX2 void silu_mul_avx2(const float* gate, const float* up, int64_t n, float* out) {
  for_each_block(n, [&](int64_t i, auto block) QHX_TARGET_AVX2 {
    block.store(out + i, _mm256_mul_ps(silu(block.load(gate + i)), block.load(up + i)));
  });
}

QHX_TARGET_AVX2 void sigmoid_gate_avx2(const float* gate, int64_t n, float* x) {
  for_each_block(n, [&](int64_t i, auto block) QHX_TARGET_AVX2 {
    block.store(x + i, _mm256_div_ps(block.load(x + i), one_plus_exp_neg(block.load(gate + i))));
  });
}

QHX_TARGET_AVX2 void l2_normalize_avx2(float* x, int64_t n, float eps) {
  const __m256 s = _mm256_set1_ps(1.0f / std::sqrt(sum_of_squares(x, n) + eps));
  for_each_block(n, [&](int64_t i, auto block) QHX_TARGET_AVX2 {
    block.store(x + i, _mm256_mul_ps(block.load(x + i), s));
  });
}

// Vectorised over channels: for each token, the kernel's inputs are `kernel` rows (from the
// state or from u) weighted tap by tap.
QHX_TARGET_AVX2 void causal_conv1d_silu_avx2(CpuContext& cx, const float* u, int64_t n_tokens,
                                             int64_t channels, const float* weight, int64_t kernel,
                                             float* state, float* out) {
  const int64_t history = kernel - 1;
  // Taps as [kernel, channels], so that one tap of eight channels is one load.
  float* taps = cx.caller_scratch().buffer<float>(Scratch::kConvTaps, kernel * channels);
  for (int64_t c = 0; c < channels; ++c) {
    for (int64_t j = 0; j < kernel; ++j) taps[j * channels + c] = weight[c * kernel + j];
  }
  std::vector<const float*> inputs(kernel);
  for (int64_t t = 0; t < n_tokens; ++t) {
    for (int64_t j = 0; j < kernel; ++j) {
      const int64_t tau = t - history + j;  // input step relative to this call
      inputs[j] = tau < 0 ? state + (history + tau) * channels : u + tau * channels;
    }
    for_each_block(channels, [&](int64_t c, auto block) QHX_TARGET_AVX2 {
      __m256 acc = _mm256_setzero_ps();
      for (int64_t j = 0; j < kernel; ++j) {
        acc = _mm256_fmadd_ps(block.load(taps + j * channels + c), block.load(inputs[j] + c), acc);
      }
      block.store(out + t * channels + c, silu(acc));
    });
  }
  // Keep the last `history` inputs, oldest first.
  if (n_tokens >= history) {
    std::memcpy(state, u + (n_tokens - history) * channels, history * channels * sizeof(float));
  } else {
    const int64_t kept = history - n_tokens;
    std::memmove(state, state + n_tokens * channels, kept * channels * sizeof(float));
    std::memcpy(state + kept * channels, u, n_tokens * channels * sizeof(float));
  }
}

}  // namespace
#endif

namespace {

// op(begin, count) over parts of [0, n) spread across the threads of cx (a prompt's activations
// are megabytes; one token's are done by the caller alone). Every element is computed the same
// way wherever a part starts.
template <typename Op>
void in_parts(CpuContext& cx, int64_t n, const Op& op) {
  constexpr int64_t kPart = 4096;
  cx.split_rows((n + kPart - 1) / kPart, 1, n, [&](int64_t begin, int64_t end) {
    op(begin * kPart, std::min(n, end * kPart) - begin * kPart);
  });
}

}  // namespace

void rms_norm(CpuContext& cx, const float* x, const float* weight, int64_t n, float eps, float* y) {
#if defined(__x86_64__)
  if (cx.kernels().avx2) return rms_norm_avx2(x, weight, n, eps, y);
#endif
  ref::rms_norm(x, weight, n, eps, y);
}

void rms_norm_rows(CpuContext& cx, const float* x, const float* weight, int64_t n_rows, int64_t n,
                   float eps, float* y) {
  cx.split_rows(n_rows, 1, n_rows * n, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) rms_norm(cx, x + r * n, weight, n, eps, y + r * n);
  });
}

void add_rms_norm_rows(CpuContext& cx, float* h, const float* y, const float* weight,
                       int64_t n_rows, int64_t n, float eps, float* x) {
  cx.split_rows(n_rows, 1, n_rows * n, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      for (int64_t i = r * n; i < (r + 1) * n; ++i) h[i] += y[i];
      rms_norm(cx, h + r * n, weight, n, eps, x + r * n);
    }
  });
}

void rope_rotate_half(CpuContext& cx, float* x, int64_t n_vectors, int64_t stride,
                      int64_t rotary_dim, const float* cos, const float* sin) {
#if defined(__x86_64__)
  if (cx.kernels().avx2) return rope_rotate_half_avx2(x, n_vectors, stride, rotary_dim, cos, sin);
#endif
  ref::rope_rotate_half(x, n_vectors, stride, rotary_dim, cos, sin);
}

void silu_mul(CpuContext& cx, const float* gate, const float* up, int64_t n, float* out) {
  in_parts(cx, n, [&](int64_t i, int64_t count) {
#if defined(__x86_64__)
    if (cx.kernels().avx2) return silu_mul_avx2(gate + i, up + i, count, out + i);
#endif
    ref::silu_mul(gate + i, up + i, count, out + i);
  });
}

void sigmoid_gate(CpuContext& cx, const float* gate, int64_t n, float* x) {
  in_parts(cx, n, [&](int64_t i, int64_t count) {
#if defined(__x86_64__)
    if (cx.kernels().avx2) return sigmoid_gate_avx2(gate + i, count, x + i);
#endif
    ref::sigmoid_gate(gate + i, count, x + i);
  });
}

void l2_normalize(CpuContext& cx, float* x, int64_t n, float eps) {
#if defined(__x86_64__)
  if (cx.kernels().avx2) return l2_normalize_avx2(x, n, eps);
#endif
  ref::l2_normalize(x, n, eps);
}

void causal_conv1d_silu(CpuContext& cx, const float* u, int64_t n_tokens, int64_t channels,
                        const float* weight, int64_t kernel, float* state, float* out) {
#if defined(__x86_64__)
  if (cx.kernels().avx2) {
    return causal_conv1d_silu_avx2(cx, u, n_tokens, channels, weight, kernel, state, out);
  }
#endif
  ref::causal_conv1d_silu(u, n_tokens, channels, weight, kernel, state, out);
}

}  // namespace qhx
