// Runs a model's plans on its backends (the CPU and any devices), knowing nothing of the model:
// it caches each plan's schedule, decides whether a pass uses the devices, and keeps the promise
// every device makes to its callers — a pass a device fails (Error kDeviceFailed) is redone on
// the CPU from the state it started from, the devices are not used again, and the caller sees
// only the failure count. A model gives it a plan builder (PlanKey → Plan) and its sequences'
// states (Sequence); models/decoder.cc is the one model.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "graph/backend.h"
#include "graph/plan.h"
#include "graph/schedule.h"

namespace qhx {

class CpuContext;

// Which plan: its token count and the model's variant of it (which outputs, which numerics).
struct PlanKey {
  int64_t n_tokens = 0;
  int variant = 0;
  bool operator==(const PlanKey&) const = default;
};

// A sequence's state as plans run on it: one LayerState per layer and the tokens it holds. A
// device that keeps the conv and recurrent states it computes past its passes
// (Backend::keep_states) leaves their host memory behind; `kept` lists those passes, so that the
// runner can bring the host memory up to date (settle: the device writes the states back, or,
// when it has failed, the CPU redoes the passes).
struct Sequence {
  struct KeptPasses {
    struct Pass {
      std::vector<int32_t> ids;
      PlanKey replay;  // the plan that leaves the states as this pass did (Pass::replay)
    };
    std::vector<Pass> passes;
    int64_t tokens = 0;
    std::function<void(const Sequence&)> settle;

    KeptPasses() = default;
    // A copy is made from settled memory: it keeps nothing.
    KeptPasses(const KeptPasses&) {}
    KeptPasses& operator=(const KeptPasses&) {
      passes.clear();
      tokens = 0;
      settle = nullptr;
      return *this;
    }
  };

  std::vector<LayerState> layers;
  int64_t tokens = 0;
  mutable KeptPasses kept;

  // The host memory of every state up to date (what reads it calls first).
  void settle() const {
    if (!kept.passes.empty()) kept.settle(*this);
  }
  // The first n tokens are the sequence again; what the conv and recurrent states hold of them
  // is the caller's business (the KV caches are cut to n rows).
  void back_to(int64_t n);
  // The conv and recurrent states (two per Gated DeltaNet layer).
  std::vector<const StateBuffer*> whole_states() const;
};

// What ran on devices (since the runner was made).
struct DeviceTraffic {
  int64_t passes = 0, copies = 0, copy_bytes = 0;
  int64_t tokens = 0;  // the tokens of those passes (an NPU's: its prompt chunks' rows)
  DeviceTraffic operator-(const DeviceTraffic& o) const {
    return {passes - o.passes, copies - o.copies, copy_bytes - o.copy_bytes, tokens - o.tokens};
  }
  DeviceTraffic& operator+=(const DeviceTraffic& o) {
    passes += o.passes;
    copies += o.copies;
    copy_bytes += o.copy_bytes;
    tokens += o.tokens;
    return *this;
  }
};

class Runner {
 public:
  using PlanBuilder = std::function<Plan(const PlanKey&)>;
  // What a pass computes: `plan`; `replay` leaves the states as `plan` does without its
  // outputs (what the CPU redoes when a device that kept the states fails); a step-exact pass
  // (verifying a draft) must compute what a decode step computes, so it runs where `decode_step`
  // runs rather than where prompts do.
  struct Pass {
    PlanKey plan, replay;
    bool step_exact = false;
  };

  // backends[0] is the CPU's, on `context` (it runs every node); the devices follow, if any.
  // `decode_step` is the plan of one decoded token.
  Runner(CpuContext& context, std::vector<std::shared_ptr<Backend>> backends, PlanBuilder build,
         PlanKey decode_step);
  // The devices may read the weights in place, and may outlive the runner: release_weights
  // first.
  ~Runner();
  Runner(const Runner&) = delete;
  Runner& operator=(const Runner&) = delete;

  // Numbers the model's weights (number_weights), then each backend lays out or copies the
  // weights it will read: the devices first (they copy from the mapped pages), then the CPU
  // (which releases the pages of what it packs). A device without room for them, or failing as
  // they go up, is left unused with the reason (device_load_failure), rather than failing the
  // load.
  void prepare_weights(const WeightList& weights);
  // Weights only the CPU reads (a drafter's).
  void prepare_cpu_weights(const WeightList& weights);
  // The devices that took these weights forget them (the memory they lie in is about to go).
  // Never throws.
  void release_weights(const WeightList& weights) noexcept;

  // Memory for a sequence's states: what the CPU and the device that shares the sequence with it
  // both address (the CPU's when it runs alone).
  const BufferType& state_memory() const;
  // The CPU's memory (for sequences only the CPU runs: a drafter's).
  const BufferType& cpu_memory() const;

  // Runs pass.plan over `ids` on `sequence` (appending them), its external values bound to
  // `outputs`, on the devices when they are enabled and the plan places nodes there. Call on the
  // context's turn.
  void run(std::span<const int32_t> ids, const Pass& pass, Sequence& sequence,
           std::span<Buffer* const> outputs) const;
  // The same on the CPU alone, with the rows' M-RoPE positions if any (RunInputs::positions).
  void run_on_cpu(std::span<const int32_t> ids, const PlanKey& plan, Sequence& sequence,
                  std::span<Buffer* const> outputs, std::span<const int32_t> positions = {}) const;
  // Bytes of the arenas a plan runs in (where it runs now). Call on the context's turn.
  int64_t arena_bytes(const PlanKey& plan) const;

  bool has_devices() const { return !devices_.empty(); }
  bool devices_enabled() const { return devices_enabled_.load(); }
  void set_devices_enabled(bool on) {
    devices_enabled_ = on && !devices_.empty() && load_failure_.empty();
  }
  const std::string& device_load_failure() const { return load_failure_; }
  // The largest Backend::rows_multiple of the devices while they are enabled, else 0.
  int64_t rows_multiple() const;
  int64_t device_failures() const { return device_failures_.load(); }
  // Why the devices were last disabled by a failure ("" if never), and what ran on them: read on
  // the context's turn.
  std::string device_failure() const;
  DeviceTraffic device_traffic() const;

 private:
  // The plan placed, fused and laid out for the devices (or the CPU alone), cached. On the turn.
  Schedule& schedule_for(const PlanKey& key, bool devices) const;
  std::span<Backend* const> backends(bool devices) const {
    return std::span<Backend* const>(backends_).first(devices ? backends_.size() : 1);
  }
  void execute_on(const PlanKey& key, bool devices, std::span<const int32_t> ids,
                  Sequence& sequence, std::span<Buffer* const> outputs,
                  std::span<const int32_t> positions = {}) const;
  bool decodes_on_devices() const;  // whether a decode step puts nodes on a device
  // Whether every conv and delta-rule node of the schedule runs on devices that keep the states
  // they compute (Backend::keep_states), and tells them to keep them or not accordingly.
  bool keeps_states(const Schedule& s) const;
  // Brings the sequence's host memory up to date (Sequence::kept). settle takes the context's
  // turn; settle_on_turn is for a caller that has it.
  void settle(const Sequence& sequence) const;
  void settle_on_turn(const Sequence& sequence) const;
  // A device failed: it is not used again, and the sequence's kept passes are redone on the CPU.
  void device_failed(const Error& e, Sequence& sequence) const;

  CpuContext& context_;
  std::shared_ptr<Backend> cpu_;
  std::vector<std::shared_ptr<Backend>> devices_;
  std::vector<Backend*> prepared_;  // the devices holding the model's weights
  std::vector<Backend*> backends_;  // the CPU, then the devices
  PlanBuilder build_;
  PlanKey decode_step_;
  struct CachedSchedule {
    PlanKey key;
    bool devices = false;
    Schedule schedule;
    uint64_t last_used = 0;
  };
  mutable std::vector<CachedSchedule> schedules_;  // on the context's turn
  mutable uint64_t schedule_clock_ = 0;
  // Off after a device failed (a pass disables it, so mutable) or failed its check.
  mutable std::atomic<bool> devices_enabled_;
  mutable std::atomic<int64_t> device_failures_{0};
  mutable DeviceTraffic traffic_;       // on the turn
  mutable std::string device_failure_;  // on the turn
  std::string load_failure_;            // why the devices took no weights: they stay unused
};

}  // namespace qhx
