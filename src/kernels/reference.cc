#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/kernels.h"

namespace qhx {

bool uses_int8_activations(const MatrixRef& w) {
  if (w.activations != Activations::kInt8) return false;
  if (w.dtype == DType::kW8) return w.cols % kActivationBlock == 0;
  return w.dtype == DType::kW4 && w.group_size % (2 * kActivationBlock) == 0;
}

}  // namespace qhx

namespace qhx::ref {

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
    case DType::kW8: {
      const int8_t* q = static_cast<const int8_t*>(w.data) + base;
      const float scale = static_cast<const float*>(w.scales)[row];
      for (int64_t c = 0; c < w.cols; ++c) out[c] = scale * static_cast<float>(q[c]);
      return;
    }
    case DType::kW4: {
      const uint8_t* packed = static_cast<const uint8_t*>(w.data) + base / 2;
      const uint16_t* scales =
          static_cast<const uint16_t*>(w.scales) + row * (w.cols / w.group_size);
      for (int64_t c = 0; c < w.cols; ++c) {
        const int nibble = (packed[c / 2] >> (c % 2 * 4)) & 0xF;
        const int q = (nibble ^ 8) - 8;  // sign-extend the int4
        out[c] = f16_to_f32(scales[c / w.group_size]) * static_cast<float>(q);
      }
      return;
    }
    default:
      break;
  }
  std::abort();  // callers only build MatrixRefs of weight types
}

void quantize_activations(const float* x, int64_t cols, int8_t* q, float* scales) {
  for (int64_t b = 0; b < cols / kActivationBlock; ++b) {
    const float* xb = x + b * kActivationBlock;
    int8_t* qb = q + b * kActivationBlock;
    float max_abs = 0.0f;
    bool finite = true;
    for (int64_t i = 0; i < kActivationBlock; ++i) {
      finite = finite && std::isfinite(xb[i]);
      max_abs = std::max(max_abs, std::fabs(xb[i]));
    }
    if (!finite || max_abs == 0.0f) {
      scales[b] = finite ? 0.0f : std::numeric_limits<float>::quiet_NaN();
      std::fill(qb, qb + kActivationBlock, int8_t{0});
      continue;
    }
    scales[b] = max_abs / 127.0f;
    const float inverse = 127.0f / max_abs;
    for (int64_t i = 0; i < kActivationBlock; ++i) {
      qb[i] = static_cast<int8_t>(std::nearbyint(xb[i] * inverse));
    }
  }
}

namespace {

// The integer weights of row r, one int8 per column (W4 sign-extended), and the scale of each
// activation block (the row's scale, or the scale of the W4 group holding the block).
void integer_row(const MatrixRef& w, int64_t r, int8_t* q, float* block_scales) {
  const int64_t n_blocks = w.cols / kActivationBlock;
  if (w.dtype == DType::kW8) {
    std::memcpy(q, static_cast<const int8_t*>(w.data) + r * w.cols, w.cols);
    std::fill(block_scales, block_scales + n_blocks, static_cast<const float*>(w.scales)[r]);
    return;
  }
  const uint8_t* packed = static_cast<const uint8_t*>(w.data) + r * w.cols / 2;
  for (int64_t c = 0; c < w.cols; ++c) {
    const int nibble = (packed[c / 2] >> (c % 2 * 4)) & 0xF;
    q[c] = static_cast<int8_t>((nibble ^ 8) - 8);
  }
  const uint16_t* scales = static_cast<const uint16_t*>(w.scales) + r * (w.cols / w.group_size);
  for (int64_t b = 0; b < n_blocks; ++b) {
    block_scales[b] = f16_to_f32(scales[b * kActivationBlock / w.group_size]);
  }
}

void matmul_int8_activations(const float* x, int64_t n_tokens, const MatrixRef& w, float* y) {
  const int64_t n_blocks = w.cols / kActivationBlock;
  std::vector<int8_t> qx(n_tokens * w.cols), qw(w.cols);
  std::vector<float> sx(n_tokens * n_blocks), sw(n_blocks);
  for (int64_t t = 0; t < n_tokens; ++t) {
    quantize_activations(x + t * w.cols, w.cols, &qx[t * w.cols], &sx[t * n_blocks]);
  }
  for (int64_t r = 0; r < w.rows; ++r) {
    integer_row(w, r, qw.data(), sw.data());
    for (int64_t t = 0; t < n_tokens; ++t) {
      float sum = 0.0f;
      for (int64_t b = 0; b < n_blocks; ++b) {
        int32_t dot = 0;
        for (int64_t c = b * kActivationBlock; c < (b + 1) * kActivationBlock; ++c) {
          dot += int32_t{qw[c]} * int32_t{qx[t * w.cols + c]};
        }
        sum += sw[b] * sx[t * n_blocks + b] * static_cast<float>(dot);
      }
      y[t * w.rows + r] = sum;
    }
  }
}

}  // namespace

// Each weight row is widened or dequantised once by read_row, so every dtype shares the same
// f32 arithmetic.
void matmul(const float* x, int64_t n_tokens, const MatrixRef& w, float* y) {
  if (uses_int8_activations(w)) return matmul_int8_activations(x, n_tokens, w, y);
  std::vector<float> row(w.cols);
  for (int64_t r = 0; r < w.rows; ++r) {
    read_row(w, r, row.data());
    for (int64_t t = 0; t < n_tokens; ++t) {
      const float* xt = x + t * w.cols;
      float sum = 0.0f;
      for (int64_t c = 0; c < w.cols; ++c) sum += xt[c] * row[c];
      y[t * w.rows + r] = sum;
    }
  }
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
  const int64_t head_floats = kv_head_floats(shape.kv, hd);
  const int64_t kv_stride = shape.kv_row_floats();
  // A cached head as float32: in place for f32 rows, else its elements read back into `row`.
  std::vector<float> row(shape.kv == KvType::kF32 ? 0 : hd);
  const auto cached = [&](const float* rows, int64_t j, int64_t kv_head) {
    const float* head = rows + j * kv_stride + kv_head * head_floats;
    if (shape.kv == KvType::kF32) return head;
    kv_load_head(shape.kv, head, hd, row.data());
    return static_cast<const float*>(row.data());
  };
  for (int64_t t = 0; t < n_queries; ++t) {
    const int64_t n_keys = first_pos + t + 1;
    for (int64_t h = 0; h < shape.n_heads; ++h) {
      const float* qh = q + t * q_stride + h * hd;
      const int64_t kv_head = h / group;
      for (int64_t j = 0; j < n_keys; ++j) {
        const float* kj = cached(keys, j, kv_head);
        float dot = 0.0f;
        for (int64_t d = 0; d < hd; ++d) dot += qh[d] * kj[d];
        scores[j] = dot * scale;
      }
      softmax(scores, n_keys);
      float* oh = out + t * q_stride + h * hd;
      std::memset(oh, 0, hd * sizeof(float));
      for (int64_t j = 0; j < n_keys; ++j) {
        const float* vj = cached(values, j, kv_head);
        const float p = scores[j];
        for (int64_t d = 0; d < hd; ++d) oh[d] += p * vj[d];
      }
    }
  }
}

void layer_norm(const float* x, const float* weight, const float* bias, int64_t n, float eps,
                float* y) {
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) sum += x[i];
  const float mean = sum / static_cast<float>(n);
  float sum_sq = 0.0f;
  for (int64_t i = 0; i < n; ++i) sum_sq += (x[i] - mean) * (x[i] - mean);
  const float inv = 1.0f / std::sqrt(sum_sq / static_cast<float>(n) + eps);
  for (int64_t i = 0; i < n; ++i) y[i] = (x[i] - mean) * inv * weight[i] + bias[i];
}

void gelu(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    x[i] = 0.5f * x[i] * (1.0f + std::erf(x[i] * 0.70710678118654752f));
}

void gelu_tanh(float* x, int64_t n) {
  constexpr float kSqrt2OverPi = 0.79788456080286536f;
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    x[i] = 0.5f * v * (1.0f + std::tanh(kSqrt2OverPi * (v + 0.044715f * v * v * v)));
  }
}

void bidirectional_attention(const float* q, int64_t n_rows, const float* keys, const float* values,
                             const AttentionShape& shape, float scale, float* out, float* scores) {
  // Query t of a causal pass n_rows − 1 rows in sees every key: one query at a time.
  const int64_t q_stride = shape.n_heads * shape.head_dim;
  for (int64_t t = 0; t < n_rows; ++t) {
    causal_attention(q + t * q_stride, 1, n_rows - 1, keys, values, shape, scale,
                     out + t * q_stride, scores);
  }
}

void sigmoid_gate(const float* gate, int64_t n, float* x) {
  for (int64_t i = 0; i < n; ++i) x[i] *= 1.0f / (1.0f + std::exp(-gate[i]));
}

void l2_normalize(float* x, int64_t n, float eps) {
  float sum_sq = 0.0f;
  for (int64_t i = 0; i < n; ++i) sum_sq += x[i] * x[i];
  const float inv = 1.0f / std::sqrt(sum_sq + eps);
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

void causal_conv1d_silu(const float* u, int64_t n_tokens, int64_t channels, const float* weight,
                        int64_t kernel, float* state, float* out) {
  const int64_t history = kernel - 1;
  // Input at step τ relative to this call: the state for τ < 0, else u.
  const auto input = [&](int64_t tau, int64_t c) {
    return tau < 0 ? state[(history + tau) * channels + c] : u[tau * channels + c];
  };
  for (int64_t t = 0; t < n_tokens; ++t) {
    for (int64_t c = 0; c < channels; ++c) {
      float acc = 0.0f;
      for (int64_t j = 0; j < kernel; ++j)
        acc += weight[c * kernel + j] * input(t - history + j, c);
      out[t * channels + c] = acc / (1.0f + std::exp(-acc));
    }
  }
  // Keep the last `history` inputs, oldest first.
  std::vector<float> next(history * channels);
  for (int64_t h = 0; h < history; ++h) {
    for (int64_t c = 0; c < channels; ++c) {
      next[h * channels + c] = input(n_tokens - history + h, c);
    }
  }
  std::copy(next.begin(), next.end(), state);
}

// Both delta-rule references compute in double and round to f32 where a real kernel must store:
// the state after every token (recurrent) or chunk (chunked), and the outputs. The chunked form's
// triangular solve loses a few bits in f32; in double the two paths agree to the storage rounding.
void gated_delta_rule_recurrent(const float* q, const float* k, const float* v, const float* beta,
                                const float* g, int64_t n_tokens, const DeltaRuleShape& shape,
                                float* state, float* out) {
  const int64_t dk = shape.k_dim, dv = shape.v_dim, group = shape.n_v_heads / shape.n_k_heads;
  std::vector<double> S(dk * dv), delta(dv);
  for (int64_t t = 0; t < n_tokens; ++t) {
    for (int64_t j = 0; j < shape.n_v_heads; ++j) {
      const float* qt = q + (t * shape.n_k_heads + j / group) * dk;
      const float* kt = k + (t * shape.n_k_heads + j / group) * dk;
      const float* vt = v + (t * shape.n_v_heads + j) * dv;
      const double b = beta[t * shape.n_v_heads + j];
      const double decay = std::exp(static_cast<double>(g[t * shape.n_v_heads + j]));
      float* stored = state + j * dk * dv;
      for (int64_t i = 0; i < dk * dv; ++i) S[i] = stored[i] * decay;  // decay before the read
      for (int64_t c = 0; c < dv; ++c) {
        double memory = 0.0;
        for (int64_t a = 0; a < dk; ++a) memory += S[a * dv + c] * kt[a];
        delta[c] = (vt[c] - memory) * b;
      }
      for (int64_t a = 0; a < dk; ++a) {
        for (int64_t c = 0; c < dv; ++c) S[a * dv + c] += kt[a] * delta[c];
      }
      float* ot = out + (t * shape.n_v_heads + j) * dv;
      for (int64_t c = 0; c < dv; ++c) {
        double o = 0.0;
        for (int64_t a = 0; a < dk; ++a) o += S[a * dv + c] * qt[a];
        ot[c] = static_cast<float>(o);
      }
      for (int64_t i = 0; i < dk * dv; ++i) stored[i] = static_cast<float>(S[i]);
    }
  }
}

void gated_delta_rule_chunked(const float* q, const float* k, const float* v, const float* beta,
                              const float* g, int64_t n_tokens, const DeltaRuleShape& shape,
                              int64_t chunk, float* state, float* out) {
  const int64_t dk = shape.k_dim, dv = shape.v_dim, group = shape.n_v_heads / shape.n_k_heads;
  const int64_t hk = shape.n_k_heads, hv = shape.n_v_heads;
  std::vector<double> S(dk * dv), G(chunk), A(chunk * chunk), U(chunk * dv), W(chunk * dk), o(dv);
  const auto dot = [](const float* x, const float* y, int64_t n) {
    double sum = 0.0;
    for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(x[i]) * y[i];
    return sum;
  };
  for (int64_t j = 0; j < hv; ++j) {
    float* stored = state + j * dk * dv;
    std::copy(stored, stored + dk * dv, S.begin());
    const int64_t kh = j / group;
    for (int64_t start = 0; start < n_tokens; start += chunk) {
      const int64_t n = std::min(chunk, n_tokens - start);
      const auto q_at = [&](int64_t i) { return q + ((start + i) * hk + kh) * dk; };
      const auto k_at = [&](int64_t i) { return k + ((start + i) * hk + kh) * dk; };
      const auto v_at = [&](int64_t i) { return v + ((start + i) * hv + j) * dv; };
      const auto beta_at = [&](int64_t i) {
        return static_cast<double>(beta[(start + i) * hv + j]);
      };
      // Cumulative log-decay inside the chunk.
      double cumulative = 0.0;
      for (int64_t i = 0; i < n; ++i) G[i] = cumulative += g[(start + i) * hv + j];
      // A = strictly lower β_i (k_i·k_p) e^{G_i−G_p}; solve (I + A) U = βv, (I + A) W = β e^G k
      // by forward substitution.
      for (int64_t i = 0; i < n; ++i) {
        for (int64_t p = 0; p < i; ++p) {
          A[i * chunk + p] = beta_at(i) * dot(k_at(i), k_at(p), dk) * std::exp(G[i] - G[p]);
        }
        for (int64_t c = 0; c < dv; ++c) U[i * dv + c] = beta_at(i) * v_at(i)[c];
        const double scale = beta_at(i) * std::exp(G[i]);
        for (int64_t c = 0; c < dk; ++c) W[i * dk + c] = scale * k_at(i)[c];
        for (int64_t p = 0; p < i; ++p) {
          const double a = A[i * chunk + p];
          for (int64_t c = 0; c < dv; ++c) U[i * dv + c] -= a * U[p * dv + c];
          for (int64_t c = 0; c < dk; ++c) W[i * dk + c] -= a * W[p * dk + c];
        }
      }
      // V' = U − W S (held in U).
      for (int64_t i = 0; i < n; ++i) {
        for (int64_t a = 0; a < dk; ++a) {
          const double w = W[i * dk + a];
          for (int64_t c = 0; c < dv; ++c) U[i * dv + c] -= w * S[a * dv + c];
        }
      }
      // o_i = e^{G_i} Sᵀq_i + Σ_{p≤i} (q_i·k_p) e^{G_i−G_p} V'_p, with S the incoming state.
      for (int64_t i = 0; i < n; ++i) {
        const float* qi = q_at(i);
        std::fill(o.begin(), o.end(), 0.0);
        for (int64_t a = 0; a < dk; ++a) {
          for (int64_t c = 0; c < dv; ++c) o[c] += S[a * dv + c] * qi[a];
        }
        const double outer_decay = std::exp(G[i]);
        for (int64_t c = 0; c < dv; ++c) o[c] *= outer_decay;
        for (int64_t p = 0; p <= i; ++p) {
          const double w = dot(qi, k_at(p), dk) * std::exp(G[i] - G[p]);
          for (int64_t c = 0; c < dv; ++c) o[c] += w * U[p * dv + c];
        }
        float* oi = out + ((start + i) * hv + j) * dv;
        for (int64_t c = 0; c < dv; ++c) oi[c] = static_cast<float>(o[c]);
      }
      // S ← e^{G_n} S + Σ_p e^{G_n−G_p} k_p V'_pᵀ, stored as f32 at the chunk boundary.
      const double last = G[n - 1];
      for (int64_t i = 0; i < dk * dv; ++i) S[i] *= std::exp(last);
      for (int64_t p = 0; p < n; ++p) {
        const double w = std::exp(last - G[p]);
        const float* kp = k_at(p);
        for (int64_t a = 0; a < dk; ++a) {
          const double ka = w * kp[a];
          for (int64_t c = 0; c < dv; ++c) S[a * dv + c] += ka * U[p * dv + c];
        }
      }
      for (int64_t i = 0; i < dk * dv; ++i) S[i] = stored[i] = static_cast<float>(S[i]);
    }
  }
}

}  // namespace qhx::ref
