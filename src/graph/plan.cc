#include "graph/plan.h"

namespace qhx {

bool updates_in_place(Op op) {
  switch (op) {
    case Op::kAdd:
    case Op::kRope:
    case Op::kSigmoidGate:
    case Op::kL2Norm:
    case Op::kDeltaGates:
    case Op::kAddBias:
    case Op::kGelu:
    case Op::kGeluTanh:
      return true;
    default:
      return false;
  }
}

bool updates_out2_in_place(Op op) {
  return op == Op::kDeltaGates;
}

const char* op_name(Op op) {
  switch (op) {
    case Op::kEmbed:
      return "embed";
    case Op::kRmsNorm:
      return "rms_norm";
    case Op::kAdd:
      return "add";
    case Op::kMatmul:
      return "matmul";
    case Op::kCopyColumns:
      return "copy_columns";
    case Op::kSplitHeads:
      return "split_heads";
    case Op::kRope:
      return "rope";
    case Op::kAttention:
      return "attention";
    case Op::kSigmoidGate:
      return "sigmoid_gate";
    case Op::kSiluMul:
      return "silu_mul";
    case Op::kConvSilu:
      return "conv_silu";
    case Op::kL2Norm:
      return "l2_norm";
    case Op::kDeltaGates:
      return "delta_gates";
    case Op::kDeltaRule:
      return "delta_rule";
    case Op::kLayerNorm:
      return "layer_norm";
    case Op::kAddBias:
      return "add_bias";
    case Op::kGelu:
      return "gelu";
    case Op::kGeluTanh:
      return "gelu_tanh";
    case Op::kBidirectionalAttention:
      return "bidirectional_attention";
    case Op::kCopy:
      return "copy";
  }
  return "?";
}

ValueId Plan::add_value(int64_t rows, int64_t cols, int binding) {
  Value v;
  v.rows = rows;
  v.cols = cols;
  v.binding = binding;
  values.push_back(v);
  return static_cast<ValueId>(values.size() - 1);
}

Node& Plan::add(Op op) {
  Node node{};
  node.op = op;
  nodes.push_back(node);
  return nodes.back();
}

std::string Plan::describe(const Node& node) const {
  // Appends only: GCC 12 warns, wrongly, of "..." + std::string (-Wrestrict).
  std::string text = op_name(node.op);
  const auto name = [&](const Operand& o) {
    const Value& v = values[o.value];
    text += " v";
    text += std::to_string(o.value);
    text += "[";
    text += std::to_string(v.rows);
    text += "x";
    text += std::to_string(v.cols);
    text += "]";
    if (o.row != 0) {
      text += "@";
      text += std::to_string(o.row);
    }
  };
  if (node.layer >= 0) {
    text += " (layer ";
    text += std::to_string(node.layer);
    text += ")";
  }
  if (node.out.value != kNoValue) name(node.out);
  if (node.out2.value != kNoValue) name(node.out2);
  text += " <-";
  for (const Operand& in : node.in) {
    if (in.value != kNoValue) name(in);
  }
  text += ", ";
  text += std::to_string(node.rows);
  text += " rows";
  return text;
}

void number_weights(const WeightList& weights) {
  int64_t id = 0;
  for (MatrixRef* m : weights.matrices) m->id = id++;
  for (MatrixRef* m : weights.tables) m->id = id++;
  for (WeightVector* v : weights.vectors) v->id = id++;
}

}  // namespace qhx
