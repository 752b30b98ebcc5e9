// What a compute backend offers the scheduler (graph/schedule.h): which nodes it runs, which it
// asks for although their weights live elsewhere, how it fuses adjacent nodes, an arena for its
// activations, and running nodes. The CPU backend (graph/cpu_backend.h) runs every node; a GPU or
// NPU backend runs what it supports and the CPU the rest. Backends know ops, never models.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "graph/plan.h"

namespace qhx {

// A node's operands resolved for its backend: pointers to each value's first row (in that
// backend's memory), plus the run's inputs.
struct NodeArgs {
  std::span<float* const> values;  // indexed by ValueId
  const RunInputs* inputs = nullptr;
  float* at(const Operand& o, const Plan& plan) const {
    return values[o.value] + o.row * plan.values[o.value].cols;
  }
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  virtual bool supports(const Node& node) const = 0;
  // True when it asks for a node it supports although the node's weights live elsewhere (a device
  // takes prompt-sized matmuls).
  virtual bool claims(const Node&) const { return false; }
  // Sets Node::fused on runs of adjacent nodes (all placed on this backend) it runs as one. The
  // default fuses nothing.
  virtual void fuse(const Plan&, std::span<Node>) const {}
  // Memory for at least `floats` activations, valid until the next call (the scheduler asks once
  // per plan, for that plan's arena; the backend keeps the largest).
  virtual float* arena(int64_t floats) = 0;
  // Runs nodes[0] and the nodes fused with it.
  virtual void run(const Plan& plan, std::span<const Node> nodes, const NodeArgs& args) = 0;
};

}  // namespace qhx
