#include <cmath>
#include <cstdlib>
#include <cstring>

#include "kernels/kernels.h"

namespace qhx::ref {
namespace {

template <typename Widen>
void matmul_rows(const float* x, int64_t n_tokens, const MatrixRef& w, float* y, Widen widen) {
  for (int64_t t = 0; t < n_tokens; ++t) {
    const float* xt = x + t * w.cols;
    for (int64_t r = 0; r < w.rows; ++r) {
      float sum = 0.0f;
      for (int64_t c = 0; c < w.cols; ++c) sum += xt[c] * widen(r * w.cols + c);
      y[t * w.rows + r] = sum;
    }
  }
}

}  // namespace

void read_row(const MatrixRef& w, int64_t row, float* out) {
  const int64_t base = row * w.cols;
  switch (w.dtype) {
    case DType::kF32:
      std::memcpy(out, static_cast<const float*>(w.data) + base, w.cols * sizeof(float));
      return;
    case DType::kBF16:
      for (int64_t c = 0; c < w.cols; ++c) {
        out[c] = bf16_to_f32(static_cast<const uint16_t*>(w.data)[base + c]);
      }
      return;
    case DType::kF16:
      for (int64_t c = 0; c < w.cols; ++c) {
        out[c] = f16_to_f32(static_cast<const uint16_t*>(w.data)[base + c]);
      }
      return;
    default:
      break;
  }
  std::abort();  // callers only build MatrixRefs of float types
}

void matmul(const float* x, int64_t n_tokens, const MatrixRef& w, float* y) {
  switch (w.dtype) {
    case DType::kF32: {
      const auto* p = static_cast<const float*>(w.data);
      return matmul_rows(x, n_tokens, w, y, [p](int64_t i) { return p[i]; });
    }
    case DType::kBF16: {
      const auto* p = static_cast<const uint16_t*>(w.data);
      return matmul_rows(x, n_tokens, w, y, [p](int64_t i) { return bf16_to_f32(p[i]); });
    }
    case DType::kF16: {
      const auto* p = static_cast<const uint16_t*>(w.data);
      return matmul_rows(x, n_tokens, w, y, [p](int64_t i) { return f16_to_f32(p[i]); });
    }
    default:
      break;
  }
  std::abort();
}

void rms_norm(const float* x, const float* weight, int64_t n, float eps, float* y) {
  float sum_sq = 0.0f;
  for (int64_t i = 0; i < n; ++i) sum_sq += x[i] * x[i];
  const float inv_rms = 1.0f / std::sqrt(sum_sq / static_cast<float>(n) + eps);
  for (int64_t i = 0; i < n; ++i) y[i] = weight[i] * (x[i] * inv_rms);
}

void rope_rotate_half(float* x, int64_t n_vectors, int64_t stride, int64_t rotary_dim,
                      const float* cos, const float* sin) {
  const int64_t half = rotary_dim / 2;
  for (int64_t v = 0; v < n_vectors; ++v) {
    float* a = x + v * stride;
    float* b = a + half;
    for (int64_t i = 0; i < half; ++i) {
      const float ai = a[i], bi = b[i];
      a[i] = ai * cos[i] - bi * sin[i];
      b[i] = bi * cos[i] + ai * sin[i];
    }
  }
}

void silu_mul(const float* gate, const float* up, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

void softmax(float* x, int64_t n) {
  float max = x[0];
  for (int64_t i = 1; i < n; ++i) max = std::fmax(max, x[i]);
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - max);
    sum += x[i];
  }
  const float inv = 1.0f / sum;
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

void causal_attention(const float* q, int64_t n_queries, int64_t first_pos, const float* keys,
                      const float* values, const AttentionShape& shape, float scale, float* out,
                      float* scores) {
  const int64_t hd = shape.head_dim;
  const int64_t group = shape.n_heads / shape.n_kv_heads;
  const int64_t q_stride = shape.n_heads * hd;
  const int64_t kv_stride = shape.n_kv_heads * hd;
  for (int64_t t = 0; t < n_queries; ++t) {
    const int64_t n_keys = first_pos + t + 1;
    for (int64_t h = 0; h < shape.n_heads; ++h) {
      const float* qh = q + t * q_stride + h * hd;
      const int64_t kv_head = h / group;
      for (int64_t j = 0; j < n_keys; ++j) {
        const float* kj = keys + j * kv_stride + kv_head * hd;
        float dot = 0.0f;
        for (int64_t d = 0; d < hd; ++d) dot += qh[d] * kj[d];
        scores[j] = dot * scale;
      }
      softmax(scores, n_keys);
      float* oh = out + t * q_stride + h * hd;
      std::memset(oh, 0, hd * sizeof(float));
      for (int64_t j = 0; j < n_keys; ++j) {
        const float* vj = values + j * kv_stride + kv_head * hd;
        const float p = scores[j];
        for (int64_t d = 0; d < hd; ++d) oh[d] += p * vj[d];
      }
    }
  }
}

}  // namespace qhx::ref
