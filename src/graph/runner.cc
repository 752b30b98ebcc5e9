#include "graph/runner.h"

#include <algorithm>

#include "kernels/cpu_context.h"
#include "util/error.h"

namespace qhx {
namespace {

// Whether any node of the schedule runs on a device (backend 0 is the CPU).
bool uses_devices(const Schedule& s) {
  return std::any_of(s.plan.nodes.begin(), s.plan.nodes.end(),
                     [](const Node& n) { return n.backend > 0; });
}

// The tokens of a pass that a device read: all of them when it ran a node over every row, none
// when it ran only the last row's (the lm-head of a prompt's tail, say).
int64_t device_tokens(const Schedule& s, int64_t n_tokens) {
  const bool read = std::any_of(s.plan.nodes.begin(), s.plan.nodes.end(), [&](const Node& n) {
    return n.backend > 0 && n.op != Op::kCopy && n.rows == n_tokens;
  });
  return read ? n_tokens : 0;
}

// The conv and recurrent states as they are, to put back if a device fails part-way through a
// pass that updated them in place.
std::vector<std::vector<float>> copy_whole_states(const Sequence& sequence) {
  std::vector<std::vector<float>> out;
  for (const StateBuffer* whole : sequence.whole_states()) out.push_back(whole->to_vector());
  return out;
}

void restore_whole_states(Sequence& sequence, const std::vector<std::vector<float>>& saved) {
  size_t part = 0;
  for (LayerState& l : sequence.layers) {
    if (l.conv.empty()) continue;
    l.conv.assign(saved[part++]);
    l.recurrent.assign(saved[part++]);
  }
}

}  // namespace

void Sequence::back_to(int64_t n) {
  for (LayerState& l : layers) {
    if (l.conv.empty()) {
      l.keys.resize(std::min(l.keys.size(), n * l.kv_row_floats));
      l.values.resize(std::min(l.values.size(), n * l.kv_row_floats));
    }
  }
  tokens = n;
}

std::vector<const StateBuffer*> Sequence::whole_states() const {
  std::vector<const StateBuffer*> out;
  for (const LayerState& l : layers) {
    if (!l.conv.empty()) out.insert(out.end(), {&l.conv, &l.recurrent});
  }
  return out;
}

Runner::Runner(CpuContext& context, std::vector<std::shared_ptr<Backend>> backends,
               PlanBuilder build, PlanKey decode_step)
    : context_(context),
      cpu_(backends.at(0)),
      devices_(backends.begin() + 1, backends.end()),
      build_(std::move(build)),
      decode_step_(decode_step),
      devices_enabled_(!devices_.empty()) {
  backends_.push_back(cpu_.get());
  for (const auto& d : devices_) backends_.push_back(d.get());
}

Runner::~Runner() = default;

void Runner::prepare_weights(const WeightList& weights) {
  number_weights(weights);
  for (size_t b = backends_.size(); b-- > 1;) {
    try {
      backends_[b]->prepare_weights(weights);
      prepared_.push_back(backends_[b]);
    } catch (const Error& e) {  // it holds none of them
      if (e.kind() != ErrorKind::kOutOfMemory && e.kind() != ErrorKind::kDeviceFailed) throw;
      devices_enabled_ = false;
      ++device_failures_;
      device_failure_ = load_failure_ = e.what();
    }
  }
  if (!load_failure_.empty()) release_weights(weights);  // the devices stay unused
  cpu_->prepare_weights(weights);
}

void Runner::prepare_cpu_weights(const WeightList& weights) {
  cpu_->prepare_weights(weights);
}

void Runner::release_weights(const WeightList& weights) noexcept {
  for (Backend* d : prepared_) {
    try {
      d->release_weights(weights);
    } catch (...) {  // a lost device: its memory went with it
    }
  }
  prepared_.clear();
}

const BufferType& Runner::state_memory() const {
  if (load_failure_.empty()) {
    for (const auto& d : devices_) {
      if (d->computes_states()) return d->state_buffer_type();
    }
  }
  return cpu_->buffer_type();
}

int64_t Runner::rows_multiple() const {
  int64_t rows = 0;
  if (!devices_enabled_) return rows;
  for (const auto& d : devices_) rows = std::max(rows, d->rows_multiple());
  return rows;
}

const BufferType& Runner::cpu_memory() const {
  return cpu_->buffer_type();
}

std::string Runner::device_failure() const {
  const CpuContext::Turn turn(context_);
  return device_failure_;
}

DeviceTraffic Runner::device_traffic() const {
  const CpuContext::Turn turn(context_);
  return traffic_;
}

Schedule& Runner::schedule_for(const PlanKey& key, bool devices) const {
  ++schedule_clock_;
  for (CachedSchedule& c : schedules_) {
    if (c.key == key && c.devices == devices) {
      c.last_used = schedule_clock_;
      return c.schedule;
    }
  }
  Schedule made = schedule(build_(key), backends(devices));
  // A bounded cache (a schedule is its nodes' layout; the arenas it runs in are each backend's,
  // one per backend): a decode step, the prefill chunks and decoding with speculation's small
  // plans (verify passes of 2..k+1 tokens, replays, a drafter's) stay; odd tails come and go.
  constexpr size_t kMaxSchedules = 32;
  if (schedules_.size() == kMaxSchedules) {
    schedules_.erase(std::min_element(schedules_.begin(), schedules_.end(),
                                      [](const CachedSchedule& a, const CachedSchedule& b) {
                                        return a.last_used < b.last_used;
                                      }));
  }
  schedules_.push_back({key, devices, std::move(made), schedule_clock_});
  return schedules_.back().schedule;
}

int64_t Runner::arena_bytes(const PlanKey& plan) const {
  return schedule_for(plan, devices_enabled_).arena_bytes();
}

bool Runner::decodes_on_devices() const {
  return uses_devices(schedule_for(decode_step_, true));
}

void Runner::execute_on(const PlanKey& key, bool devices, std::span<const int32_t> ids,
                        Sequence& sequence, std::span<Buffer* const> outputs,
                        std::span<const int32_t> positions) const {
  const RunInputs inputs{.ids = ids,
                         .first_pos = sequence.tokens,
                         .positions = positions,
                         .layers = sequence.layers,
                         .external = outputs};
  execute(schedule_for(key, devices), backends(devices), inputs);
}

void Runner::run_on_cpu(std::span<const int32_t> ids, const PlanKey& plan, Sequence& sequence,
                        std::span<Buffer* const> outputs,
                        std::span<const int32_t> positions) const {
  execute_on(plan, false, ids, sequence, outputs, positions);
  sequence.tokens += static_cast<int64_t>(ids.size());
}

void Runner::run(std::span<const int32_t> ids, const Pass& pass, Sequence& sequence,
                 std::span<Buffer* const> outputs) const {
  const int64_t n_tokens = static_cast<int64_t>(ids.size());
  const int64_t first_pos = sequence.tokens;
  bool devices = devices_enabled_;
  if (devices && pass.step_exact) devices = decodes_on_devices();
  Schedule* s = &schedule_for(pass.plan, devices);
  if (devices && !uses_devices(*s)) {
    devices = false;  // nothing of this pass runs on a device (a decode step, say)
  }
  const bool kept = devices && keeps_states(*s);
  if (!kept) {
    settle_on_turn(sequence);  // this pass reads the states' host memory
    // A write-back that failed has turned the devices off; replaying may evict schedules.
    devices = devices && devices_enabled_;
    s = &schedule_for(pass.plan, devices);
  }
  const RunInputs inputs{
      .ids = ids, .first_pos = first_pos, .layers = sequence.layers, .external = outputs};
  if (!devices) {
    execute(*s, backends(false), inputs);
  } else if (kept) {
    // The device leaves the states' host memory as it was (at the start of the kept passes).
    try {
      execute(*s, backends(true), inputs);
      traffic_ += {.passes = 1,
                   .copies = s->copies,
                   .copy_bytes = s->copy_bytes,
                   .tokens = device_tokens(*s, n_tokens)};
      Sequence::KeptPasses& kept_passes = sequence.kept;
      kept_passes.passes.push_back({{ids.begin(), ids.end()}, pass.replay});
      kept_passes.tokens += n_tokens;
      kept_passes.settle = [this](const Sequence& settled) { settle(settled); };
    } catch (const Error& e) {
      if (e.kind() != ErrorKind::kDeviceFailed) throw;
      device_failed(e, sequence);
      execute_on(pass.plan, false, ids, sequence, outputs);
    }
  } else {
    // A device may fail part-way, after updating recurrent states in place: what it started
    // from is kept (the conv and recurrent states; KV rows past the sequence are rewritten).
    const std::vector<std::vector<float>> start = copy_whole_states(sequence);
    try {
      execute(*s, backends(true), inputs);
      traffic_ += {.passes = 1,
                   .copies = s->copies,
                   .copy_bytes = s->copy_bytes,
                   .tokens = device_tokens(*s, n_tokens)};
    } catch (const Error& e) {
      if (e.kind() != ErrorKind::kDeviceFailed) throw;
      device_failed(e, sequence);
      for (const StateBuffer* whole : sequence.whole_states()) whole->forget_shadow();
      restore_whole_states(sequence, start);
      sequence.back_to(first_pos);
      execute_on(pass.plan, false, ids, sequence, outputs);
    }
  }
  sequence.tokens += n_tokens;
  // Written back now and then: a failure then costs the CPU at most this many tokens to redo.
  constexpr int64_t kMaxKeptTokens = 256;
  if (sequence.kept.tokens >= kMaxKeptTokens) settle_on_turn(sequence);
}

bool Runner::keeps_states(const Schedule& s) const {
  // (Attention-only models have no such states: their passes change only KV rows past the
  // sequence, which the device writes back as it goes.)
  bool any = false, on_devices = true;
  for (const Node& n : s.plan.nodes) {
    if (n.op != Op::kConvSilu && n.op != Op::kDeltaRule) continue;
    any = true;
    if (n.backend == 0) on_devices = false;
  }
  // Kept only if every device that computes states keeps them (a device computing none, an NPU,
  // has no say); else none does.
  bool kept = on_devices && any;
  for (const std::shared_ptr<Backend>& device : devices_) {
    if (device->computes_states()) kept = device->keep_states(kept) && kept;
  }
  if (!kept) {
    for (const std::shared_ptr<Backend>& device : devices_) device->keep_states(false);
  }
  return kept;
}

void Runner::settle(const Sequence& sequence) const {
  const CpuContext::Turn turn(context_);
  settle_on_turn(sequence);
}

void Runner::settle_on_turn(const Sequence& settled) const {
  if (settled.kept.passes.empty()) return;
  // Settling changes no token of the sequence, only where its states' newest elements lie.
  auto& sequence = const_cast<Sequence&>(settled);
  try {
    const std::vector<const StateBuffer*> whole = sequence.whole_states();
    for (const std::shared_ptr<Backend>& device : devices_) device->write_back_states(whole);
    sequence.kept = {};
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::kDeviceFailed) throw;
    device_failed(e, sequence);
  }
}

void Runner::device_failed(const Error& e, Sequence& sequence) const {
  devices_enabled_ = false;
  ++device_failures_;
  device_failure_ = e.what();
  // What the device kept is lost: the host memory holds the states as the kept passes found
  // them, and the CPU redoes those passes as they ran (their outputs are not needed again).
  for (const StateBuffer* whole : sequence.whole_states()) whole->forget_shadow();
  const int64_t redone = sequence.kept.tokens;
  const std::vector<Sequence::KeptPasses::Pass> passes = std::move(sequence.kept.passes);
  sequence.kept = {};
  sequence.back_to(sequence.tokens - redone);
  std::vector<std::vector<float>> scratch;
  for (const Sequence::KeptPasses::Pass& pass : passes) {
    // The replay's outputs go to scratch memory of their sizes.
    const Schedule& s = schedule_for(pass.replay, false);
    std::vector<std::unique_ptr<BorrowedBuffer>> memory;
    std::vector<Buffer*> outputs;
    for (const Value& v : s.plan.values) {
      if (!v.external()) continue;
      const size_t binding = static_cast<size_t>(v.binding);
      if (binding >= scratch.size()) scratch.resize(binding + 1);
      if (binding >= memory.size()) memory.resize(binding + 1);
      scratch[binding].resize(static_cast<size_t>(v.floats()));
      memory[binding] = std::make_unique<BorrowedBuffer>(BufferKind::kHost, scratch[binding].data(),
                                                         scratch[binding].size() * sizeof(float),
                                                         BorrowedBuffer::kWritable);
    }
    for (auto& m : memory) outputs.push_back(m.get());
    run_on_cpu(pass.ids, pass.replay, sequence, outputs);
  }
}

}  // namespace qhx
