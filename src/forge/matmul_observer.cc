#include "forge/matmul_observer.h"

namespace qhx {

MatmulObserver::MatmulObserver(std::shared_ptr<CpuContext> context, Observe observe)
    : context_(std::move(context)),
      cpu_(*context_, /*fusion=*/false),
      observe_(std::move(observe)) {}

void MatmulObserver::run(const Plan& plan, std::span<const Node> nodes, const NodeArgs& args) {
  const Node& n = nodes.front();
  if (n.op != Op::kMatmul) {
    cpu_.run(plan, nodes, args);
    return;
  }
  const auto stand_in = stand_ins_.find(n.matrix->data);
  if (stand_in == stand_ins_.end()) {
    cpu_.run(plan, nodes, args);
  } else {
    Node swapped = n;
    swapped.matrix = &stand_in->second;
    cpu_.run(plan, std::span(&swapped, 1), args);
  }
  if (!observe_) return;
  observe_({.w = *n.matrix,
            .x = args.at(n.in[0]),
            .x_stride = args.values[n.in[0].value].strides[0],
            .y = args.at(n.out),
            .y_stride = args.values[n.out.value].strides[0],
            .rows = n.rows});
}

}  // namespace qhx
