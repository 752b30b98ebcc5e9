#include "backend/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/attention.h"
#include "kernels/delta_rule.h"
#include "kernels/elementwise.h"
#include "kernels/matmul.h"
#include "kernels/matmul_int8.h"
#include "kernels/thread_pool.h"
#include "util/error.h"
#include "util/mapped_file.h"

namespace qhx {
namespace {

constexpr int64_t kMaxRotaryPairs = 512;  // RoPE frequencies a head may have (Qwen: ≤ 128)

bool same(const Operand& a, const Operand& b) {
  return a.value == b.value && a.row == b.row;
}

// cos and sin of each RoPE angle at `position`, as transformers computes them (in f32).
// Row t's RoPE angles: at first_pos + t, or with M-RoPE axes, at the row's position on the axis
// of each frequency.
void rotary_angles(const RunInputs& inputs, int64_t t, const Node& rope, float* cos, float* sin) {
  const bool axes = rope.rope_axes != nullptr && !inputs.positions.empty();
  const int64_t rows = static_cast<int64_t>(inputs.positions.size()) / 3;
  for (int64_t i = 0; i < rope.rotary_dim / 2; ++i) {
    const int64_t position =
        axes ? inputs.positions[rope.rope_axes[i] * rows + t] : inputs.first_pos + t;
    const float angle = static_cast<float>(position) * (*rope.vector)[i];
    cos[i] = std::cos(angle);
    sin[i] = std::sin(angle);
  }
}

// Token t's [query | gate] halves of each head, from both into q and gate.
void split_heads(const float* both, int64_t t, int64_t n_heads, int64_t hd, float* q, float* gate) {
  for (int64_t h = 0; h < n_heads; ++h) {
    const float* src = both + (t * n_heads + h) * 2 * hd;
    std::copy(src, src + hd, q + (t * n_heads + h) * hd);
    std::copy(src + hd, src + 2 * hd, gate + (t * n_heads + h) * hd);
  }
}

// The fusable runs starting at nodes[i]: how many nodes follow it in the run (0: none).
int matmul_run(std::span<const Node> nodes, size_t i) {
  int fused = 0;
  for (size_t j = i + 1; j < nodes.size() && fused < 3; ++j, ++fused) {
    const Node& n = nodes[j];
    if (n.op != Op::kMatmul || !same(n.in[0], nodes[i].in[0]) || n.rows != nodes[i].rows) break;
  }
  return fused;
}

int add_norm_run(const Plan& plan, std::span<const Node> nodes, size_t i) {
  if (i + 1 >= nodes.size()) return 0;
  const Node &add = nodes[i], &norm = nodes[i + 1];
  const bool fits = norm.op == Op::kRmsNorm && same(norm.in[0], add.out) && norm.rows == add.rows &&
                    norm.width == plan.values[add.out.value].cols;
  return fits ? 1 : 0;
}

// [split_heads,] rms_norm q, rms_norm k, rope q, rope k: each on its own value, in place.
int qk_norm_rope_run(std::span<const Node> nodes, size_t i) {
  const bool split = nodes[i].op == Op::kSplitHeads;
  const size_t first = i + (split ? 1 : 0);
  if (first + 3 >= nodes.size()) return 0;
  const Node &nq = nodes[first], &nk = nodes[first + 1];
  const Node &rq = nodes[first + 2], &rk = nodes[first + 3];
  if (nq.op != Op::kRmsNorm || nk.op != Op::kRmsNorm || rq.op != Op::kRope || rk.op != Op::kRope) {
    return 0;
  }
  const bool in_place = same(nq.in[0], nq.out) && same(nk.in[0], nk.out) && same(rq.out, nq.out) &&
                        same(rk.out, nk.out);
  const bool widths = nq.width == rq.width && nk.width == rk.width && nq.width == nk.width &&
                      rq.rotary_dim == rk.rotary_dim && rq.vector == rk.vector;
  const int64_t rows = nodes[i].rows;
  const bool rows_match = nq.rows == rows && nk.rows == rows && rq.rows == rows && rk.rows == rows;
  const bool split_feeds = !split || same(nodes[i].out, nq.in[0]);
  if (!in_place || !widths || !rows_match || !split_feeds) return 0;
  return split ? 4 : 3;
}

}  // namespace

std::string CpuBackend::name() const {
  return "cpu (" + context_.kernels().describe() + ", " + std::to_string(context_.threads()) +
         " threads)";
}

void CpuBackend::fuse(const Plan& plan, std::span<Node> nodes) const {
  if (!fusion_) return;
  for (size_t i = 0; i < nodes.size(); i += nodes[i].fused + 1) {
    switch (nodes[i].op) {
      case Op::kMatmul:
        nodes[i].fused = matmul_run(nodes, i);
        break;
      case Op::kAdd:
        nodes[i].fused = add_norm_run(plan, nodes, i);
        break;
      case Op::kSplitHeads:
      case Op::kRmsNorm:
        nodes[i].fused = qk_norm_rope_run(nodes, i);
        break;
      default:
        break;
    }
  }
}

void CpuBackend::prepare_weights(const WeightList& weights) {
  std::vector<MatrixRef*> packable;
  for (MatrixRef* m : weights.matrices) {
    if (m->data != nullptr && packs_for_int8_kernels(context_.kernels(), *m)) packable.push_back(m);
  }
  // Each matrix is read once, in full, packed, and its mapped pages released at once, so that
  // the load's peak holds one copy of the weights. On as many threads of their own as the
  // context has: a model may load while another model's forward pass runs on the same context.
  std::vector<PackedMatrix> packed(packable.size());
  run_on_own_threads(static_cast<int64_t>(packable.size()), context_.threads(), [&](int64_t i) {
    const MatrixRef& m = *packable[i];
    const uint64_t bytes = matrix_bytes(m.dtype, m.rows, m.cols, m.group_size);
    MappedFile::populate_pages(m.data, bytes);
    packed[i] = pack_for_int8_kernels(context_.kernels(), m);
    if (m.buffer == nullptr) return;  // memory its owner keeps (core/matrix_rows.h), not mapped
    MappedFile::release_pages(m.data, bytes);
    if (m.dtype == DType::kW4) {  // the panels carry the group scales too
      MappedFile::release_pages(m.scales,
                                matrix_scale_bytes(m.dtype, m.rows, m.cols, m.group_size));
    }
  });
  for (size_t i = 0; i < packable.size(); ++i) {
    packable[i]->packed = packed[i].data();
    prepared_.push_back(std::move(packed[i]));
  }
}

Buffer& CpuBackend::arena(size_t bytes) {
  if (arena_ == nullptr || arena_->bytes() < bytes) arena_ = host_.allocate(bytes);
  return *arena_;
}

void CpuBackend::run(const Plan& plan, std::span<const Node> nodes, const NodeArgs& args) {
  CpuContext& cx = context_;
  const Node& head = nodes[0];
  if (nodes.size() == 1) return run_one(plan, head, args);
  const auto at = [&](const Operand& o) { return args.at(o); };

  if (head.op == Op::kMatmul) {
    const float* x = at(head.in[0]);
    const auto out = [&](size_t k) { return MatmulOutput{*nodes[k].matrix, at(nodes[k].out)}; };
    switch (nodes.size()) {
      case 2:
        return matmul(cx, x, head.rows, {out(0), out(1)});
      case 3:
        return matmul(cx, x, head.rows, {out(0), out(1), out(2)});
      default:
        return matmul(cx, x, head.rows, {out(0), out(1), out(2), out(3)});
    }
  }
  if (head.op == Op::kAdd) {
    const Node& norm = nodes[1];
    const int64_t cols = plan.values[head.out.value].cols;
    return add_rms_norm_rows(cx, at(head.out), at(head.in[0]), norm.vector->data(), head.rows, cols,
                             norm.eps, at(norm.out));
  }

  // The query/gate split, q/k head norms and RoPE, token by token, tokens spread over the threads.
  const bool split = head.op == Op::kSplitHeads;
  const Node &nq = nodes[split ? 1 : 0], &nk = nodes[split ? 2 : 1], &rope = nodes[split ? 3 : 2];
  const int64_t hd = nq.width;
  float* q = at(nq.out);
  float* k = at(nk.out);
  const int64_t q_width = plan.values[nq.out.value].cols;
  const int64_t kv_width = plan.values[nk.out.value].cols;
  const int64_t n_heads = q_width / hd, n_kv = kv_width / hd;
  cx.split_rows(head.rows, 1, head.rows * (q_width + kv_width), [&](int64_t begin, int64_t end) {
    float cos[kMaxRotaryPairs], sin[kMaxRotaryPairs];
    for (int64_t t = begin; t < end; ++t) {
      if (split) split_heads(at(head.in[0]), t, n_heads, hd, q, at(head.out2));
      float* qt = q + t * q_width;
      float* kt = k + t * kv_width;
      for (int64_t h = 0; h < n_heads; ++h) {
        rms_norm(cx, qt + h * hd, nq.vector->data(), hd, nq.eps, qt + h * hd);
      }
      for (int64_t h = 0; h < n_kv; ++h) {
        rms_norm(cx, kt + h * hd, nk.vector->data(), hd, nk.eps, kt + h * hd);
      }
      rotary_angles(*args.inputs, t, rope, cos, sin);
      rope_rotate_half(cx, qt, n_heads, hd, rope.rotary_dim, cos, sin);
      rope_rotate_half(cx, kt, n_kv, hd, rope.rotary_dim, cos, sin);
    }
  });
}

void CpuBackend::run_one(const Plan& plan, const Node& node, const NodeArgs& args) {
  CpuContext& cx = context_;
  const auto at = [&](const Operand& o) { return args.at(o); };
  const auto cols = [&](const Operand& o) { return plan.values[o.value].cols; };
  const RunInputs& inputs = *args.inputs;
  float* out = node.out.value != kNoValue && node.op != Op::kCopy ? at(node.out) : nullptr;
  switch (node.op) {
    case Op::kEmbed:
      for (int64_t t = 0; t < node.rows; ++t) {
        read_row(cx, *node.matrix, inputs.ids[t], out + t * cols(node.out));
      }
      return;
    case Op::kRmsNorm: {
      const int64_t n = node.rows * cols(node.out) / node.width;
      return rms_norm_rows(cx, at(node.in[0]), node.vector->data(), n, node.width, node.eps, out);
    }
    case Op::kAdd: {
      const float* y = at(node.in[0]);
      const int64_t n = node.rows * cols(node.out);
      cx.split_rows(n, 4096, n, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) out[i] += y[i];
      });
      return;
    }
    case Op::kMatmul:
      return matmul(cx, at(node.in[0]), node.rows, *node.matrix, out);
    case Op::kCopyColumns: {
      const float* in = at(node.in[0]);
      const int64_t in_cols = cols(node.in[0]), out_cols = cols(node.out);
      for (int64_t t = 0; t < node.rows; ++t) {
        std::copy_n(in + t * in_cols + node.offset, out_cols, out + t * out_cols);
      }
      return;
    }
    case Op::kSplitHeads:
      for (int64_t t = 0; t < node.rows; ++t) {
        split_heads(at(node.in[0]), t, cols(node.out) / node.width, node.width, out, at(node.out2));
      }
      return;
    case Op::kRope: {
      const int64_t width = cols(node.out);
      cx.split_rows(node.rows, 1, node.rows * width, [&](int64_t begin, int64_t end) {
        float cos[kMaxRotaryPairs], sin[kMaxRotaryPairs];
        for (int64_t t = begin; t < end; ++t) {
          rotary_angles(inputs, t, node, cos, sin);
          rope_rotate_half(cx, out + t * width, width / node.width, node.width, node.rotary_dim,
                           cos, sin);
        }
      });
      return;
    }
    case Op::kAttention: {
      LayerState& cache = inputs.layers[node.layer];
      const AttentionShape& a = node.attention;
      const int64_t row_floats = cache.kv_row_floats, first_pos = inputs.first_pos;
      const int64_t kv_width = a.n_kv_heads * a.head_dim;
      cache.keys.resize((first_pos + node.rows) * row_floats);
      cache.values.resize((first_pos + node.rows) * row_floats);
      float* keys = cache.keys.data() + first_pos * row_floats;
      float* values = cache.values.data() + first_pos * row_floats;
      for (int64_t t = 0; t < node.rows; ++t) {  // the new rows, as the cache's type holds them
        kv_store_row(a.kv, at(node.in[1]) + t * kv_width, a.n_kv_heads, a.head_dim,
                     keys + t * row_floats);
        kv_store_row(a.kv, at(node.in[2]) + t * kv_width, a.n_kv_heads, a.head_dim,
                     values + t * row_floats);
      }
      return causal_attention(cx, at(node.in[0]), node.rows, first_pos, cache.keys.data(),
                              cache.values.data(), node.attention, node.scale, out);
    }
    case Op::kSigmoidGate:
      return sigmoid_gate(cx, at(node.in[0]), node.rows * cols(node.out), out);
    case Op::kSiluMul:
      return silu_mul(cx, at(node.in[0]), at(node.in[1]), node.rows * cols(node.out), out);
    case Op::kConvSilu:
      return causal_conv1d_silu(cx, at(node.in[0]), node.rows, cols(node.out), node.vector->data(),
                                node.width, inputs.layers[node.layer].conv.data(), out);
    case Op::kL2Norm: {
      const int64_t n = node.rows * cols(node.out);
      for (int64_t i = 0; i < n; i += node.width) {
        l2_normalize(cx, out + i, node.width, 1e-6f);
        if (node.scale != 1.0f) {
          for (int64_t d = 0; d < node.width; ++d) out[i + d] *= node.scale;
        }
      }
      return;
    }
    case Op::kDeltaGates: {
      // β = σ(b); g = −exp(A_log) · softplus(a + dt_bias), softplus threshold 20.
      float* beta = out;
      float* g = at(node.out2);
      const int64_t hv = cols(node.out);
      for (int64_t t = 0; t < node.rows; ++t) {
        for (int64_t j = 0; j < hv; ++j) {
          const int64_t i = t * hv + j;
          beta[i] = 1.0f / (1.0f + std::exp(-beta[i]));
          const float s = g[i] + (*node.vector2)[j];
          const float softplus = s > 20.0f ? s : std::log1p(std::exp(s));
          g[i] = -std::exp((*node.vector)[j]) * softplus;
        }
      }
      return;
    }
    case Op::kDeltaRule: {
      float* state = inputs.layers[node.layer].recurrent.data();
      const float *q = at(node.in[0]), *k = at(node.in[1]), *v = at(node.in[2]);
      const float *beta = at(node.in[3]), *g = at(node.in[4]);
      if (node.rows == 1 || node.chunk == 0) {
        return gated_delta_rule_recurrent(cx, q, k, v, beta, g, node.rows, node.heads, state, out);
      }
      return gated_delta_rule_chunked(cx, q, k, v, beta, g, node.rows, node.heads, node.chunk,
                                      state, out);
    }
    case Op::kLayerNorm: {
      const int64_t n = node.rows * cols(node.out) / node.width;
      const float* in = at(node.in[0]);
      cx.split_rows(n, 16, n * node.width, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) {
          ref::layer_norm(in + i * node.width, node.vector->data(), node.vector2->data(),
                          node.width, node.eps, out + i * node.width);
        }
      });
      return;
    }
    case Op::kAddBias: {
      const int64_t width = cols(node.out);
      for (int64_t t = 0; t < node.rows; ++t) {
        for (int64_t i = 0; i < width; ++i) out[t * width + i] += (*node.vector)[i];
      }
      return;
    }
    case Op::kGelu:
    case Op::kGeluTanh: {
      const int64_t n = node.rows * cols(node.out);
      const bool tanh = node.op == Op::kGeluTanh;
      cx.split_rows(n, 4096, 10 * n, [&](int64_t begin, int64_t end) {
        (tanh ? ref::gelu_tanh : ref::gelu)(out + begin, end - begin);
      });
      return;
    }
    case Op::kBidirectionalAttention: {
      return bidirectional_attention(cx, at(node.in[0]), node.rows, at(node.in[1]), at(node.in[2]),
                                     node.attention, node.scale, out);
    }
    case Op::kCopy: {
      // The source may be another backend's memory the host cannot address.
      const TensorRef &from = args.values[node.in[0].value], &to = args.values[node.out.value];
      const size_t row_bytes = cols(node.out) * sizeof(float);
      return copy_bytes(*from.buffer, from.offset + node.in[0].row * row_bytes, *to.buffer,
                        to.offset + node.out.row * row_bytes, node.rows * row_bytes);
    }
  }
  fail("cpu backend", std::string("no implementation of ") + op_name(node.op));
}

}  // namespace qhx
