// From a model's plan to one ready to run: each node placed on a backend, copies where a value
// crosses between backends, adjacent nodes fused by their backend, and every backend's arena
// laid out (values whose lifetimes do not overlap share memory). The same schedule then runs any
// number of times with no allocation.
//
// Placement, in order: a node whose weights a backend's buffer type allocated runs on that
// backend if it supports the node; a node whose weights are on the host (a mapped file) runs on
// a backend that claims it (Backend::claims: a device takes prompt-sized work) and else on the
// CPU; a node without weights runs where the first value it reads is (an input, or the output
// an in-place node updates), if that backend supports it, and else on the CPU.
// backends[0] is the CPU backend, which supports every node. Last, each backend compiles the runs
// of nodes placed on it (Backend::compile); a run a device cannot compile runs on the CPU.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "graph/backend.h"
#include "graph/plan.h"

namespace qhx {

inline constexpr size_t kMaxBackends = 8;

struct Schedule {
  Plan plan;                          // placed, with copy nodes, fused
  std::vector<int64_t> arena_floats;  // per backend: its arena for this plan
  int64_t copies = 0;                 // copy nodes inserted: values crossing between backends
  int64_t copy_bytes = 0;             // what they copy per run
  int64_t arena_bytes() const;        // all backends
  std::vector<TensorRef> tensors;     // execute's table of where each value lives
  // Per node: what its backend compiled of the run it starts (Backend::compile), else null.
  std::vector<std::shared_ptr<const CompiledRun>> compiled;
};

Schedule schedule(Plan plan, std::span<Backend* const> backends);

// Runs the schedule on the backends it was made for (one run at a time per schedule).
void execute(Schedule& schedule, std::span<Backend* const> backends, const RunInputs& inputs);

}  // namespace qhx
