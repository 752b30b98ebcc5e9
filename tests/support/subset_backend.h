// A test backend: runs only the op kinds it is given, through their ref:: definitions (a CPU
// backend on a context of reference kernels), in an arena of its own, and claims the nodes with
// weights of at least `claim_rows` rows, as a device takes prompt-sized work. It exercises the
// scheduler's placement, fallback and copies the way a GPU backend will.
#pragma once

#include <bitset>
#include <initializer_list>
#include <string>

#include "backend/cpu_backend.h"
#include "graph/backend.h"

namespace qhx::test {

class SubsetBackend final : public Backend {
 public:
  SubsetBackend(std::initializer_list<Op> ops, int64_t claim_rows)
      : reference_(1, CpuKernels{}), inner_(reference_, /*fusion=*/false), claim_rows_(claim_rows) {
    for (const Op op : ops) ops_.set(static_cast<size_t>(op));
  }

  std::string name() const override { return "test subset backend"; }
  bool supports(const Node& node) const override { return ops_.test(static_cast<size_t>(node.op)); }
  bool claims(const Node& node) const override { return node.rows >= claim_rows_; }
  // Host memory, but a buffer type of its own: weights allocated from it are at home here.
  const BufferType& buffer_type() const override { return inner_.buffer_type(); }
  Buffer& arena(size_t bytes) override { return inner_.arena(bytes); }
  int64_t max_arena_span_bytes(const Node&) const override { return max_arena_span; }
  void run(const Plan& plan, std::span<const Node> nodes, const NodeArgs& args) override {
    ++nodes_run;
    inner_.run(plan, nodes, args);
  }

  int64_t nodes_run = 0;
  int64_t max_arena_span = INT64_MAX;  // as a device that binds only so much of its arena

 private:
  CpuContext reference_;
  CpuBackend inner_;
  std::bitset<kOpKinds> ops_;
  int64_t claim_rows_;
};

}  // namespace qhx::test
