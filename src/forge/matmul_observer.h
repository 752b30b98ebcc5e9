// A backend for forge's measurements: it takes every matmul of a model and computes it with the
// CPU's kernels, unfused, showing each product to an observer — the activation ranges of the NPU
// forms, the input statistics of calibrated quantization — and, for a sensitivity measurement,
// computes chosen matrices' products with stand-ins (the matrix quantized) instead.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>

#include "backend/cpu_backend.h"

namespace qhx {

// One matmul as it ran: y = x · wᵀ over `rows` rows, x [rows, w.cols] and y [rows, w.rows] with
// row strides in floats. `w` is the model's matrix (not a stand-in).
struct ObservedMatmul {
  const MatrixRef& w;
  const float* x;
  int64_t x_stride;
  const float* y;
  int64_t y_stride;
  int64_t rows;
};

class MatmulObserver final : public Backend {
 public:
  using Observe = std::function<void(const ObservedMatmul&)>;
  // The scheduler places it as it would an NPU: a value a matmul reads is materialized, whatever
  // the CPU would have fused. `observe` may be empty.
  MatmulObserver(std::shared_ptr<CpuContext> context, Observe observe);

  // From now on, the matrix whose data lies at each key multiplies with the mapped stand-in (same
  // shape); an empty map restores the model's own.
  void set_stand_ins(std::map<const void*, MatrixRef> stand_ins) {
    stand_ins_ = std::move(stand_ins);
  }

  std::string name() const override { return "calibration"; }
  const BufferType& buffer_type() const override { return cpu_.buffer_type(); }
  bool supports(const Node& node) const override {
    return node.op == Op::kMatmul || node.op == Op::kCopy;
  }
  bool claims(const Node& node) const override { return node.op == Op::kMatmul; }
  Buffer& arena(size_t bytes) override { return cpu_.arena(bytes); }
  void run(const Plan& plan, std::span<const Node> nodes, const NodeArgs& args) override;

 private:
  std::shared_ptr<CpuContext> context_;
  CpuBackend cpu_;
  Observe observe_;
  std::map<const void*, MatrixRef> stand_ins_;
};

}  // namespace qhx
