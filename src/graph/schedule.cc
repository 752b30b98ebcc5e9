#include "graph/schedule.h"

#include <algorithm>
#include <map>
#include <utility>

#include "util/error.h"

namespace qhx {
namespace {

// f(operand, reads, writes) for each operand of the node that names a value.
template <typename Node, typename F>
void for_each_operand(Node& node, F f) {
  for (auto& in : node.in) {
    if (in.value != kNoValue) f(in, true, false);
  }
  if (node.out.value != kNoValue) f(node.out, updates_in_place(node.op), true);
  if (node.out2.value != kNoValue) f(node.out2, updates_out2_in_place(node.op), true);
}

// The backend whose memory holds the node's weights (the one whose buffer type allocated
// them), or -1: weights in host memory or a mapped file, or none.
int weights_home(const Node& node, std::span<Backend* const> backends) {
  if (node.matrix == nullptr || node.matrix->buffer == nullptr) return -1;
  const BufferType* type = node.matrix->buffer->type();
  for (size_t b = 0; b < backends.size(); ++b) {
    if (type != nullptr && type == &backends[b]->buffer_type()) return static_cast<int>(b);
  }
  return -1;
}

// Where each logical value has a physical copy, and which copy holds its latest contents.
struct Versions {
  std::vector<std::map<int, ValueId>> copies;  // per logical value: backend → physical value
  std::vector<int> latest;                     // per logical value: backend, -1 if never written
};

// Offsets in one backend's arena for values alive over [first, last] node index: first fit.
int64_t lay_out(std::vector<Value>& values, int backend, const std::vector<int64_t>& first,
                const std::vector<int64_t>& last) {
  std::vector<ValueId> order;
  for (ValueId v = 0; v < static_cast<ValueId>(values.size()); ++v) {
    if (values[v].backend == backend && !values[v].external() && first[v] >= 0) order.push_back(v);
  }
  // Largest first: fewer holes.
  std::stable_sort(order.begin(), order.end(),
                   [&](ValueId a, ValueId b) { return values[a].floats() > values[b].floats(); });
  constexpr int64_t kAlign = 16;  // floats: 64-byte rows for the SIMD kernels
  std::vector<ValueId> placed;
  int64_t total = 0;
  for (const ValueId v : order) {
    // The placed values alive at the same time, by offset.
    std::vector<std::pair<int64_t, int64_t>> busy;
    for (const ValueId p : placed) {
      if (first[p] <= last[v] && first[v] <= last[p]) {
        busy.emplace_back(values[p].offset, values[p].offset + values[p].floats());
      }
    }
    std::sort(busy.begin(), busy.end());
    const int64_t size = (values[v].floats() + kAlign - 1) / kAlign * kAlign;
    int64_t offset = 0;
    for (const auto& [begin, end] : busy) {
      if (offset + size <= begin) break;
      offset = std::max(offset, (end + kAlign - 1) / kAlign * kAlign);
    }
    values[v].offset = offset;
    total = std::max(total, offset + size);
    placed.push_back(v);
  }
  return total;
}

// One attempt: `plan` placed (a node marked in `on_cpu` runs on the CPU), with copies, fused and
// laid out; `source` gets the plan node each placed node came from (-1: a copy).
Schedule place(Plan plan, std::span<Backend* const> backends, const std::vector<bool>& on_cpu,
               std::vector<int64_t>& source) {
  Schedule out;
  Plan& placed = out.plan;
  placed.n_tokens = plan.n_tokens;

  // 1. Placement.
  std::vector<int> producer_backend(plan.values.size(), 0);
  for (size_t i = 0; i < plan.nodes.size(); ++i) {
    Node& node = plan.nodes[i];
    int where = 0;
    if (on_cpu[i]) {
      // Its operands span more of a device's arena than one dispatch binds.
    } else if (const int home = weights_home(node, backends); home >= 0) {
      if (backends[home]->supports(node)) where = home;
    } else if (node.matrix != nullptr) {
      for (size_t b = 1; b < backends.size(); ++b) {
        if (backends[b]->supports(node) && backends[b]->claims(node)) {
          where = static_cast<int>(b);
          break;
        }
      }
    } else {
      // The first value it reads: an input, or for a node that updates in place (RoPE, the
      // q/k norms, the delta-rule gates) its output.
      int input_home = -1;
      for_each_operand(node, [&](Operand& o, bool reads, bool) {
        if (reads && input_home < 0) input_home = producer_backend[o.value];
      });
      if (input_home >= 0 && backends[input_home]->supports(node)) where = input_home;
    }
    if (!backends[where]->supports(node)) {
      fail("schedule", backends[where]->name() + " cannot run " + plan.describe(node));
    }
    node.backend = where;
    for_each_operand(node, [&](Operand& o, bool, bool writes) {
      if (writes) producer_backend[o.value] = where;
    });
  }

  // 2. Physical values per backend, and copies where a node reads a value whose latest contents
  // are on another backend. External values live on the CPU.
  Versions versions;
  versions.copies.resize(plan.values.size());
  versions.latest.assign(plan.values.size(), -1);
  const auto physical = [&](ValueId logical, int backend) {
    auto& copies = versions.copies[logical];
    if (const auto it = copies.find(backend); it != copies.end()) return it->second;
    // An external value's CPU copy is the caller's memory; elsewhere it is an arena value.
    const Value& v = plan.values[logical];
    const ValueId id = placed.add_value(v.rows, v.cols, backend == 0 ? v.binding : -1);
    placed.values[id].backend = backend;
    copies.emplace(backend, id);
    return id;
  };
  const auto copy_to = [&](ValueId logical, int backend) {
    const int from = versions.latest[logical];
    Node& copy = placed.add(Op::kCopy);
    copy.in[0] = {physical(logical, from), 0};
    copy.out = {physical(logical, backend), 0};
    copy.rows = plan.values[logical].rows;
    copy.backend = backend;
    ++out.copies;
    out.copy_bytes += copy.rows * plan.values[logical].cols * static_cast<int64_t>(sizeof(float));
  };
  // Which (logical value, backend) pairs hold the latest contents.
  std::vector<std::vector<bool>> fresh(plan.values.size(),
                                       std::vector<bool>(backends.size(), false));
  source.clear();
  for (size_t i = 0; i < plan.nodes.size(); ++i) {
    Node node = plan.nodes[i];
    for_each_operand(node, [&](Operand& o, bool reads, bool) {
      if (reads && versions.latest[o.value] >= 0 && !fresh[o.value][node.backend]) {
        copy_to(o.value, node.backend);
        fresh[o.value][node.backend] = true;
      }
    });
    for_each_operand(node, [&](Operand& o, bool, bool writes) {
      const ValueId logical = o.value;
      o.value = physical(logical, node.backend);
      if (writes) {
        std::fill(fresh[logical].begin(), fresh[logical].end(), false);
        fresh[logical][node.backend] = true;
        versions.latest[logical] = node.backend;
      }
    });
    source.resize(placed.nodes.size(), -1);  // the copies before it
    source.push_back(static_cast<int64_t>(i));
    placed.nodes.push_back(node);
  }
  for (ValueId v = 0; v < static_cast<ValueId>(plan.values.size()); ++v) {
    if (plan.values[v].external() && versions.latest[v] > 0 && !fresh[v][0]) copy_to(v, 0);
  }
  source.resize(placed.nodes.size(), -1);

  // 3. Fusion, over each run of adjacent nodes on one backend.
  for (size_t begin = 0; begin < placed.nodes.size();) {
    size_t end = begin + 1;
    while (end < placed.nodes.size() && placed.nodes[end].backend == placed.nodes[begin].backend) {
      ++end;
    }
    backends[placed.nodes[begin].backend]->fuse(
        placed, std::span<Node>(placed.nodes).subspan(begin, end - begin));
    begin = end;
  }

  // 4. Arenas: each value's lifetime is its first to last use.
  std::vector<int64_t> first(placed.values.size(), -1), last(placed.values.size(), -1);
  for (int64_t i = 0; i < static_cast<int64_t>(placed.nodes.size()); ++i) {
    for_each_operand(placed.nodes[i], [&](const Operand& o, bool, bool) {
      if (first[o.value] < 0) first[o.value] = i;
      last[o.value] = i;
    });
  }
  // A fused run reads and writes its values at once: each value's lifetime covers the run.
  for (int64_t i = 0; i < static_cast<int64_t>(placed.nodes.size());) {
    const int64_t run_end = i + placed.nodes[i].fused;
    for (int64_t j = i; j <= run_end; ++j) {
      for_each_operand(placed.nodes[j], [&](const Operand& o, bool, bool) {
        first[o.value] = std::min(first[o.value], i);
        last[o.value] = std::max(last[o.value], run_end);
      });
    }
    i = run_end + 1;
  }
  out.arena_floats.resize(backends.size());
  for (size_t b = 0; b < backends.size(); ++b) {
    out.arena_floats[b] = lay_out(placed.values, static_cast<int>(b), first, last);
  }
  return out;
}

// The bytes of its backend's arena that a node's operands span, first byte to last, and that
// they take up themselves.
struct ArenaSpan {
  int64_t span = 0, own = 0;
};
ArenaSpan arena_span(const Plan& plan, const Node& node) {
  int64_t begin = INT64_MAX, end = 0, own = 0;
  for_each_operand(node, [&](const Operand& o, bool, bool) {
    const Value& v = plan.values[o.value];
    if (v.external()) return;
    begin = std::min(begin, v.offset);
    end = std::max(end, v.offset + v.floats());
    own += v.floats();
  });
  constexpr auto kFloat = static_cast<int64_t>(sizeof(float));
  return {end > begin ? (end - begin) * kFloat : 0, own * kFloat};
}

}  // namespace

int64_t Schedule::arena_bytes() const {
  int64_t floats = 0;
  for (const int64_t f : arena_floats) floats += f;
  return floats * static_cast<int64_t>(sizeof(float));
}

Schedule schedule(Plan plan, std::span<Backend* const> backends) {
  if (backends.empty() || backends.size() > kMaxBackends) {
    fail("schedule", "1 to " + std::to_string(kMaxBackends) +
                         " backends, the CPU backend first, not " +
                         std::to_string(backends.size()));
  }
  // A device binds a window of its arena per node. While some node's operands lie further apart
  // than that, the one of those whose operands are largest (an lm-head over many tokens) runs on
  // the CPU instead and the plan is placed again: the others' layout then usually fits. Each
  // round moves a node, so this ends.
  std::vector<bool> on_cpu(plan.nodes.size(), false);
  std::vector<int64_t> source;
  for (;;) {
    Schedule s = place(plan, backends, on_cpu, source);
    int64_t largest = -1, largest_own = -1;
    for (size_t i = 0; i < s.plan.nodes.size(); ++i) {
      const Node& node = s.plan.nodes[i];
      // Copies bind nothing; a node whose weights only its device holds cannot move.
      if (node.backend == 0 || source[i] < 0 || weights_home(node, backends) >= 0) continue;
      const ArenaSpan a = arena_span(s.plan, node);
      if (a.span > backends[node.backend]->max_arena_span_bytes(node) && a.own > largest_own) {
        largest = source[i];
        largest_own = a.own;
      }
    }
    if (largest >= 0) {
      on_cpu[largest] = true;
      continue;
    }
    // Each backend compiles its runs; a run a device cannot take goes to the CPU, and the plan
    // is placed again (backends[0] runs everything: what it cannot compile is an error).
    bool moved = false;
    s.compiled.assign(s.plan.nodes.size(), nullptr);
    for (size_t i = 0, next = 0; i < s.plan.nodes.size() && !moved; i = next) {
      next = i + s.plan.nodes[i].fused + 1;
      const int b = s.plan.nodes[i].backend;
      try {
        s.compiled[i] =
            backends[b]->compile(s.plan, std::span<const Node>(s.plan.nodes).subspan(i, next - i));
      } catch (const Error& e) {
        if (e.kind() != ErrorKind::kDeviceFailed || b == 0) throw;
        for (size_t j = i; j < next; ++j) {
          if (source[j] >= 0) on_cpu[source[j]] = moved = true;
        }
        if (!moved) throw;  // copies alone: nothing to move
      }
    }
    if (!moved) return s;
  }
}

void execute(Schedule& s, std::span<Backend* const> backends, const RunInputs& inputs) {
  const Plan& plan = s.plan;
  Buffer* arenas[kMaxBackends];
  for (size_t b = 0; b < backends.size(); ++b) {
    arenas[b] = &backends[b]->arena(s.arena_floats[b] * sizeof(float));
  }
  std::vector<TensorRef>& tensors = s.tensors;
  tensors.resize(plan.values.size());
  for (size_t v = 0; v < plan.values.size(); ++v) {
    const Value& value = plan.values[v];
    if (value.external()) {
      if (value.binding >= static_cast<int>(inputs.external.size()) ||
          inputs.external[value.binding] == nullptr) {
        fail("plan", "output " + std::to_string(value.binding) + " is not bound");
      }
      Buffer* bound = inputs.external[value.binding];
      if (bound->bytes() < value.floats() * sizeof(float)) {
        fail("plan", "output " + std::to_string(value.binding) + " has " +
                         std::to_string(bound->bytes()) + " bytes, not " +
                         std::to_string(value.floats() * sizeof(float)));
      }
      tensors[v] = TensorRef::rows_of_floats(bound, 0, value.rows, value.cols);
    } else {
      tensors[v] = TensorRef::rows_of_floats(arenas[value.backend], value.offset * sizeof(float),
                                             value.rows, value.cols);
    }
  }
  NodeArgs args{tensors, &inputs};
  const std::span<const Node> nodes(plan.nodes);
  for (size_t i = 0, next = 0; i < nodes.size(); i = next) {
    next = i + nodes[i].fused + 1;
    Backend& backend = *backends[nodes[i].backend];
    args.compiled = i < s.compiled.size() ? s.compiled[i].get() : nullptr;
    backend.run(plan, nodes.subspan(i, next - i), args);
    // The next backend may read what this one wrote.
    if (next == nodes.size() || nodes[next].backend != nodes[i].backend) backend.synchronize();
  }
}

}  // namespace qhx
