#include "graph/cost.h"

#include "core/dtype.h"

namespace qhx {

NodeCost node_cost(const Plan& plan, const Node& node, int64_t first_pos) {
  constexpr double kFloat = sizeof(float);
  const auto cols = [&](const Operand& o) {
    return static_cast<double>(plan.values[o.value].cols);
  };
  const double rows = static_cast<double>(node.rows);
  const double out = node.out.value == kNoValue ? 0.0 : rows * cols(node.out);  // elements
  const auto matrix_read = [&](int64_t matrix_rows) {
    const MatrixRef& m = *node.matrix;
    return static_cast<double>(matrix_bytes(m.dtype, matrix_rows, m.cols, m.group_size) +
                               matrix_scale_bytes(m.dtype, matrix_rows, m.cols, m.group_size));
  };
  switch (node.op) {
    case Op::kEmbed:  // a row of the table per token
      return {matrix_read(node.rows) + out * kFloat, 0.0};
    case Op::kRmsNorm:  // square, sum, scale, weight
      return {(2 * out + static_cast<double>(node.width)) * kFloat, 4 * out};
    case Op::kL2Norm:
      return {2 * out * kFloat, 4 * out};
    case Op::kAdd:  // out is read too
      return {3 * out * kFloat, out};
    case Op::kSigmoidGate:  // exp, add, divide, multiply
      return {3 * out * kFloat, 4 * out};
    case Op::kSiluMul:
      return {3 * out * kFloat, 5 * out};
    case Op::kMatmul: {
      const MatrixRef& m = *node.matrix;
      const double inputs = rows * static_cast<double>(m.cols);
      return {matrix_read(m.rows) + (inputs + out) * kFloat,
              2 * rows * static_cast<double>(m.rows) * static_cast<double>(m.cols)};
    }
    case Op::kCopyColumns:
      return {2 * out * kFloat, 0.0};
    case Op::kSplitHeads:  // queries and gates out, both read
      return {2 * (out + rows * cols(node.out2)) * kFloat, 0.0};
    case Op::kRope: {  // a pair of elements: four products, two sums
      const double rotated =
          rows * (cols(node.out) / static_cast<double>(node.width)) * node.rotary_dim;
      return {2 * rotated * kFloat, 3 * rotated};
    }
    case Op::kAttention: {
      // The new keys and values appended, the cache read once, the queries read and the
      // output written; each query dots and weighs every key before it and its own.
      const AttentionShape& a = node.attention;
      const double kv_width = static_cast<double>(a.n_kv_heads * a.head_dim);
      const double kv_row = static_cast<double>(a.kv_row_floats());  // as the cache holds it
      const double keys = static_cast<double>(first_pos) + rows;
      const double query_width = static_cast<double>(a.n_heads * a.head_dim);
      const double pairs = rows * static_cast<double>(first_pos) + rows * (rows + 1) / 2;
      return {
          (2 * rows * (kv_width + kv_row) + 2 * keys * kv_row + 2 * rows * query_width) * kFloat,
          4 * pairs * query_width};
    }
    case Op::kConvSilu: {
      const double channels = cols(node.out), width = static_cast<double>(node.width);
      return {(2 * out + channels * width + 2 * channels * (width - 1)) * kFloat,
              out * (2 * width + 4)};
    }
    case Op::kDeltaGates: {  // β = σ(b) in out, g from a in out2, each read and written
      const double heads = cols(node.out);
      return {(4 * rows * heads + 2 * heads) * kFloat, 12 * rows * heads};
    }
    case Op::kDeltaRule: {
      // The state read and written once; per token and value head: decay it, kᵀS, the
      // update's outer product, and qᵀS (seven operations per element of S).
      const DeltaRuleShape& h = node.heads;
      const double state = static_cast<double>(h.n_v_heads * h.k_dim * h.v_dim);
      const double qk = 2 * rows * static_cast<double>(h.n_k_heads * h.k_dim);
      const double v = rows * static_cast<double>(h.n_v_heads * h.v_dim);
      const double gates = 2 * rows * static_cast<double>(h.n_v_heads);
      return {(2 * state + qk + 2 * v + gates) * kFloat, 7 * rows * state};
    }
    case Op::kLayerNorm:  // mean, variance, scale, weight and bias
      return {(2 * out + 2 * static_cast<double>(node.width)) * kFloat, 7 * out};
    case Op::kAddBias:
      return {(2 * out + cols(node.out)) * kFloat, out};
    case Op::kGelu:
    case Op::kGeluTanh:
      return {2 * out * kFloat, 10 * out};
    case Op::kBidirectionalAttention: {  // every query dots and weighs every row's key
      const AttentionShape& a = node.attention;
      const double width = static_cast<double>(a.n_heads * a.head_dim);
      return {4 * rows * width * kFloat, 4 * rows * rows * width};
    }
    case Op::kCopy:
      return {2 * out * kFloat, 0.0};
  }
  return {};
}

}  // namespace qhx
