// What a compute backend offers: the memory it computes in (a buffer type, from which its
// arenas and the states of the sequences that run on it are allocated), weight preparation
// (laying matrices out for its kernels, or uploading them), and to the scheduler
// (graph/schedule.h) which nodes it runs, which it asks for although their weights live
// elsewhere, how it fuses adjacent nodes, and running nodes. The CPU backend
// (backend/cpu_backend.h) runs every node; a GPU or NPU backend runs what it supports and the
// CPU the rest. Backends know ops, never models.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "graph/cost.h"
#include "graph/plan.h"
#include "util/error.h"

namespace qhx {

// What a backend made of a run of nodes before running it (a graph compiled for its compiler,
// tensors bound to the run's arena layout): the schedule keeps it (Schedule::compiled) and run
// receives it (NodeArgs::compiled), every time the schedule runs.
struct CompiledRun {
  virtual ~CompiledRun() = default;
};

// A node's operands resolved for its backend: where each value lives (a buffer of that backend,
// or the caller's memory for external values), plus the run's inputs.
struct NodeArgs {
  std::span<const TensorRef> values;  // indexed by ValueId: [rows, cols] f32
  const RunInputs* inputs = nullptr;
  const CompiledRun* compiled = nullptr;  // what compile made of this run (null: nothing)
  // The operand's first row, for backends whose kernels address the host.
  float* at(const Operand& o) const {
    const TensorRef& t = values[o.value];
    float* const first = t.host<float>();
    if (first == nullptr) fail("backend", "an operand lives in memory the host cannot address");
    return first + o.row * t.strides[0];
  }
};

// The weights a backend holds: read in place from where they lie (a mapped file the device
// imported) and copied into memory of its own.
struct WeightMemory {
  int64_t in_place_bytes = 0, copied_bytes = 0;
  // Of the copies, those the host's RAM holds (an NPU's graph constants, the copies of a GPU that
  // shares the host's memory): what memory admission counts besides the model's own weights.
  int64_t host_copied_bytes = 0;
};

// Where a device's time went (Backend::take_profile): per kind of work, nodes of one op kind
// over one weight type and one number of rows, the device's time on the commands it ran for
// them, timed on the device itself, with what they had to do (node_cost).
struct OpTime {
  std::string op;       // op_name, or "state write-back" (commands outside any node)
  std::string weights;  // a matmul's or embedding's weight type (dtype_name), else ""
  int64_t rows = 0;     // the nodes' rows (tokens)
  int64_t nodes = 0;
  double seconds = 0;
  NodeCost cost;  // summed over the nodes
  struct Kernel {
    double seconds = 0;
    std::string arithmetic;  // what it computes with (DevicePeaks::ops_per_s's key), "" nothing
  };
  std::map<std::string, Kernel> kernels;  // its share of `seconds`, by shader name (or "copy")
  // The arithmetic of the longest of its kernels that computes, "" if none does.
  std::string arithmetic() const;
};

struct DeviceProfile {
  std::vector<OpTime> ops;
  int64_t submissions = 0;
  double seconds = 0;  // all of its commands'
  DeviceProfile& operator+=(const DeviceProfile& o);
};

// What a device reaches at best, measured on it (Backend::measure_peaks): bytes read per second
// from its memory, and operations per second in each arithmetic its kernels use ("fp32 FMA",
// "int8 dot", "int8 matrix", "f16 matrix"; a multiply-add counts two).
struct DevicePeaks {
  double read_bytes_per_s = 0;
  std::map<std::string, double> ops_per_s;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  // The memory it computes in: its arenas, and the KV caches and recurrent states of the
  // sequences that run on it.
  virtual const BufferType& buffer_type() const = 0;
  // The memory of a sequence's state when this backend shares the sequence with the CPU (a
  // prompt here, the reply there): both address it. The default is buffer_type().
  virtual const BufferType& state_buffer_type() const { return buffer_type(); }
  // Whether its nodes read or write a sequence's states (KV caches, conv and recurrent states):
  // a model's states live in the state memory of the first of its devices that does. An NPU
  // taking row-wise prompt work only does not.
  virtual bool computes_states() const { return true; }
  // Lays the weights it will read out for its kernels, or copies them to its memory, keyed by
  // their ids (number_weights): once, before any plan that reads them is scheduled (a device
  // may take no node whose weights it was not given here). All or nothing: when it throws, it
  // holds none of them. The default uses them as they lie.
  virtual void prepare_weights(const WeightList& /*weights*/) {}
  // Forgets what prepare_weights made of these weights: the memory they lie in is about to go
  // (a model closing). The default holds nothing.
  virtual void release_weights(const WeightList& /*weights*/) {}
  // What prepare_weights left it holding (a device; the CPU's packed copies are not counted).
  virtual WeightMemory weight_memory() const { return {}; }
  // The coarsest form its matmuls compute weights in (an NPU's int8 rows or 4-bit blocks,
  // whatever the weights were), or kF32: as they lie. A check comparing it with the CPU allows
  // what that form loses (runtime/device_check.h).
  virtual DType computes_weights_as() const { return DType::kF32; }
  virtual bool supports(const Node& node) const = 0;
  // True when it asks for a node it supports although the node's weights live elsewhere (a device
  // takes prompt-sized matmuls).
  virtual bool claims(const Node&) const { return false; }
  // The rows it takes prompt work in multiples of (graphs of a static shape), or 0: any.
  virtual int64_t rows_multiple() const { return 0; }
  // Sets Node::fused on runs of adjacent nodes (all placed on this backend) it runs as one. The
  // default fuses nothing.
  virtual void fuse(const Plan&, std::span<Node>) const {}
  // Compiles a run of nodes placed on it (nodes[0] and the nodes fused with it), once the
  // schedule has laid out the arenas; what it returns is kept with the schedule and handed to
  // run with those nodes. May throw Error (kDeviceFailed: the device cannot take the run, and
  // the scheduler runs it on the CPU; the CPU itself must take what it is given). The default
  // compiles nothing.
  virtual std::shared_ptr<const CompiledRun> compile(const Plan& /*plan*/,
                                                     std::span<const Node> /*nodes*/) {
    return nullptr;
  }
  // At least `bytes` bytes of its memory for activations, valid until the next call (execute asks
  // for each run's arena; the backend keeps the largest it was asked for).
  virtual Buffer& arena(size_t bytes) = 0;
  // The most bytes of its arena that the node's operands may span, first byte to last (a device
  // binds a window of its arena per dispatch); the scheduler runs a node beyond it on the CPU.
  virtual int64_t max_arena_span_bytes(const Node& /*node*/) const { return INT64_MAX; }
  // Runs nodes[0] and the nodes fused with it. A device may only record them: their results are
  // in its memory once synchronize returns.
  virtual void run(const Plan& plan, std::span<const Node> nodes, const NodeArgs& args) = 0;
  // Waits for what run recorded (execute calls it before another backend reads the results,
  // and at the end of every plan). Throws Error (kDeviceFailed) when the device failed.
  virtual void synchronize() {}

  // Whether the conv and recurrent states its nodes compute from now on stay in its own memory
  // (StateBuffer::shadow) past the pass, their host memory untouched and marked behind
  // (StateBuffer::behind_shadow) until write_back_states, rather than written back as each node
  // ends: a discrete GPU keeps them (reading and writing them over PCIe at every step would cost
  // more than the step), and a pass it fails leaves their host memory as it was. Returns whether
  // it will; `keep` false, or a backend that computes states where they lie, never does.
  virtual bool keep_states(bool /*keep*/) { return false; }
  // Brings the host memory of those of `states` that are behind their copies here up to date,
  // all or none: when it throws (kDeviceFailed), that memory is as it was.
  virtual void write_back_states(std::span<const StateBuffer* const> /*states*/) {}

  // Profiling (a device opened to profile: qhx bench --profile): whether it times its commands,
  // what it timed since the last call (empty when it does not), and its peaks measured now
  // (Error when it does not profile).
  virtual bool profiles() const { return false; }
  virtual DeviceProfile take_profile() { return {}; }
  virtual DevicePeaks measure_peaks();
};

}  // namespace qhx
