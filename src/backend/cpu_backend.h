// The CPU backend: every node of a plan, on a CPU context's kernels and threads
// (kernels/cpu_context.h). With a context of reference kernels (CpuKernels{}), every node runs
// through its ref:: definition: that is the oracle other backends are tested against.
//
// Its memory is host memory (HostBufferType). Its weight preparation lays W8/W4 matrices out
// for the int8 kernels the context chose (the AVX-512 and NEON dot-product panels), and releases
// the mapped pages they were copied from.
//
// It fuses, where the plan has them side by side: matmuls of one input (quantized once, all
// rows one job for the threads), a residual add and the norm of its sum (one pass), and a
// layer's [query/gate split,] q/k head norms and RoPE (one pass per token). Fused or not, every
// element is computed the same way, so fusion never changes a bit.
#pragma once

#include <string>
#include <vector>

#include "graph/backend.h"
#include "kernels/cpu_context.h"
#include "kernels/matmul_int8.h"

namespace qhx {

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(CpuContext& context, bool fusion = true)
      : context_(context), fusion_(fusion) {}

  std::string name() const override;
  const BufferType& buffer_type() const override { return host_; }
  void prepare_weights(const WeightList& weights) override;
  bool supports(const Node&) const override { return true; }
  void fuse(const Plan& plan, std::span<Node> nodes) const override;
  Buffer& arena(size_t bytes) override;
  void run(const Plan& plan, std::span<const Node> nodes, const NodeArgs& args) override;

 private:
  void run_one(const Plan& plan, const Node& node, const NodeArgs& args);

  CpuContext& context_;
  bool fusion_;
  HostBufferType host_;
  std::unique_ptr<Buffer> arena_;
  std::vector<PackedMatrix> prepared_;  // the layouts MatrixRef::packed points into
};

}  // namespace qhx
