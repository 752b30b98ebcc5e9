// A test backend: runs only the op kinds it is given, through their ref:: definitions (a CPU
// backend on a context of reference kernels), in an arena of its own, and claims the nodes with
// weights of at least `claim_rows` rows, as a device takes prompt-sized work. It exercises the
// scheduler's placement, fallback and copies the way a GPU backend will.
#pragma once

#include <bitset>
#include <initializer_list>
#include <memory>
#include <optional>
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
  // With compiling on: each run of nodes is "compiled" into a record of its first node and
  // length, which run checks it is handed; a run containing `refuse_to_compile` cannot be.
  struct Compiled final : CompiledRun {
    const Node* first;
    size_t nodes;
  };
  std::shared_ptr<const CompiledRun> compile(const Plan&, std::span<const Node> nodes) override {
    if (!compiling) return nullptr;
    for (const Node& n : nodes) {
      if (n.op == refuse_to_compile) {
        fail("test device", "cannot compile that", ErrorKind::kDeviceFailed);
      }
    }
    ++runs_compiled;
    auto made = std::make_shared<Compiled>();
    made->first = nodes.data();
    made->nodes = nodes.size();
    return made;
  }
  void run(const Plan& plan, std::span<const Node> nodes, const NodeArgs& args) override {
    ++nodes_run;
    if (compiling) {
      const auto* compiled = dynamic_cast<const Compiled*>(args.compiled);
      if (compiled == nullptr || compiled->first != nodes.data() ||
          compiled->nodes != nodes.size()) {
        fail("test device", "run without its compiled form");
      }
      ++compiled_runs_run;
    }
    inner_.run(plan, nodes, args);
  }

  int64_t nodes_run = 0;
  bool compiling = false;
  std::optional<Op> refuse_to_compile;
  int64_t runs_compiled = 0, compiled_runs_run = 0;
  int64_t max_arena_span = INT64_MAX;  // as a device that binds only so much of its arena

 private:
  CpuContext reference_;
  CpuBackend inner_;
  std::bitset<kOpKinds> ops_;
  int64_t claim_rows_;
};

}  // namespace qhx::test
