#include "backend/qnn/hexagon_backend.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <functional>
#include <set>

#include "core/dtype.h"
#include "kernels/kernels.h"
#include "util/error.h"
#include "util/sha256.h"

namespace qhx {
namespace {

constexpr int64_t kRows = HexagonBackend::kChunkRows;

bool row_wise_op(Op op) {
  switch (op) {
    case Op::kMatmul:
    case Op::kRmsNorm:
    case Op::kAdd:
    case Op::kSiluMul:
    case Op::kSigmoidGate:
      return true;
    default:
      return false;
  }
}

// Refuses a run this backend cannot compile: the scheduler then places it on the CPU.
[[noreturn]] void cannot(const std::string& why) {
  throw Error("hexagon: " + why, ErrorKind::kDeviceFailed);
}

uint32_t dim(int64_t n) {
  if (n <= 0 || n > UINT32_MAX) cannot("a dimension of " + std::to_string(n));
  return static_cast<uint32_t>(n);
}

}  // namespace

// One compiled graph: kChunkRows rows of a run, its inputs and outputs in the order the graph
// binds them, each named by its position among the run's values (first read or write order).
struct HexagonBackend::Graph {
  QnnGraph graph;
  std::vector<size_t> inputs, outputs;  // canonical value numbers
};

namespace {

// A compiled run as a schedule keeps it: the graph and which of the plan's values each of its
// inputs and outputs is.
struct CompiledGraph final : CompiledRun {
  std::shared_ptr<HexagonBackend::Graph> graph;
  std::vector<ValueId> inputs, outputs;
  bool first_run = false;  // the plan's first run here: each of its chunks is a prompt chunk
};

}  // namespace

void add_quantized_matmul(QnnGraph& g, QnnGraph::TensorId x, QnnGraph::TensorId out,
                          const MatrixRef& w, NpuForm form, const MatmulRanges& ranges,
                          uint32_t rows) {
  if (form == NpuForm::kF16) cannot("fp16 is not a 16-bit fixed-point form");
  const auto encoded = [](const ActivationRange& range) {
    return QnnGraph::Encoding::per_tensor(qnn::kUfixed16, uf16_encoding(range));
  };
  const uint32_t in_cols = dim(w.cols), out_cols = dim(w.rows);
  const auto x16 = g.intermediate({rows, in_cols}, encoded(ranges.in));
  g.add("Quantize", {x}, {x16});
  const auto y16 = g.intermediate({rows, out_cols}, encoded(ranges.out));
  if (form == NpuForm::kW8A16) {
    const Int8Rows q = int8_rows(w);
    const auto weights = g.constant({out_cols, in_cols}, std::as_bytes(std::span(q.values)),
                                    QnnGraph::Encoding::per_row(qnn::kSfixed8, q.scales));
    g.add("FullyConnected", {x16, weights}, {y16});
  } else {
    // 4-bit blocks through a 1×1 Conv2d over [1, 1, rows, cols], its weights HWIO with the
    // output channels last: FullyConnected computes wrong values with them for some shapes
    // (HTP 5.51; tests/hexagon_test.cc).
    Int4Blocks q = int4_blocks(w);
    std::vector<int8_t> hwio(q.values.size());
    for (int64_t o = 0; o < w.rows; ++o) {
      for (int64_t i = 0; i < w.cols; ++i) hwio[i * w.rows + o] = q.values[o * w.cols + i];
    }
    const auto weights = g.constant(
        {1, 1, in_cols, out_cols}, std::as_bytes(std::span(hwio)),
        QnnGraph::Encoding::per_channel_in_blocks(3, q.row_scales, std::move(q.block_scales)));
    const auto x4 = g.intermediate({1, 1, rows, in_cols}, encoded(ranges.in));
    g.add("Reshape", {x16}, {x4});
    const auto y4 = g.intermediate({1, 1, rows, out_cols}, encoded(ranges.out));
    const uint32_t stride[] = {1, 1}, pad[] = {0, 0, 0, 0};
    g.add("Conv2d", {x4, weights}, {y4}, {},
          {{"stride", g.constant_u32({2}, stride)}, {"pad_amount", g.constant_u32({2, 2}, pad)}});
    g.add("Reshape", {y4}, {y16});
  }
  g.add("Dequantize", {y16}, {out});
}

HexagonBackend::HexagonBackend(std::shared_ptr<HexagonDevice> device, HexagonBackendOptions options)
    : device_(std::move(device)), options_(std::move(options)) {}

HexagonBackend::HexagonBackend(std::shared_ptr<HexagonDevice> device, HexagonBackendOptions options,
                               std::vector<NpuPackContext> pack)
    : HexagonBackend(std::move(device), std::move(options)) {
  const QnnLibrary& lib = device_->library();
  for (const NpuPackContext& c : pack) {
    const HexagonBinaryInfo info = read_binary_info(lib, c.binary);
    if (info.dsp_arch != device_->chip().arch) {
      fail("NPU pack", "a context compiled for v" + std::to_string(info.dsp_arch) + ", not v" +
                           std::to_string(device_->chip().arch));
    }
    auto& context = contexts_.emplace_back(std::make_unique<Context>());
    context->handle = std::make_unique<HexagonContext>(device_, c.binary);
    context->from_pack = true;
    context->binary_bytes = static_cast<int64_t>(c.binary.size());
    for (const NpuPackGraph& g : c.graphs) {
      const auto described = std::find_if(info.graphs.begin(), info.graphs.end(),
                                          [&](const auto& d) { return d.name == g.name; });
      if (described == info.graphs.end()) {
        fail("NPU pack", "graph " + g.name + " is not in its context binary");
      }
      // Its inputs and outputs as the binary has them: one per value the manifest names, each
      // a chunk of rows, no value named twice.
      std::set<size_t> inputs(g.inputs.begin(), g.inputs.end()),
          outputs(g.outputs.begin(), g.outputs.end());
      bool fits = g.inputs.size() == described->inputs.size() &&
                  g.outputs.size() == described->outputs.size() &&
                  inputs.size() == g.inputs.size() && outputs.size() == g.outputs.size() &&
                  graphs_.count(g.key) == 0;
      for (const auto* tensors : {&described->inputs, &described->outputs}) {
        for (const HexagonBinaryInfo::Tensor& t : *tensors) {
          fits = fits && t.dims.size() == 2 && t.dims[0] == kRows;
        }
      }
      if (!fits) fail("NPU pack", "graph " + g.name + " does not match its context binary");
      graphs_[g.key] = std::make_shared<Graph>(
          Graph{QnnGraph::retrieve(*context->handle, *described), g.inputs, g.outputs});
      context->keys.push_back(g.key);
      ++graphs_from_pack_;
    }
  }
}

HexagonBackend::~HexagonBackend() {
  graphs_.clear();  // before their contexts
  contexts_.clear();
}

HexagonContext& HexagonBackend::context_for(int64_t bytes) {
  if (contexts_.empty() || contexts_.back()->from_pack || contexts_.back()->retired ||
      (!contexts_.back()->keys.empty() &&
       contexts_.back()->const_estimate + bytes > options_.context_budget_bytes)) {
    auto context = std::make_unique<Context>();
    context->handle = std::make_unique<HexagonContext>(device_);  // may throw: nothing added
    contexts_.push_back(std::move(context));
  }
  contexts_.back()->const_estimate += bytes;
  return *contexts_.back()->handle;
}

std::vector<NpuPackContext> HexagonBackend::export_contexts() const {
  std::vector<NpuPackContext> out;
  const QnnLibrary& lib = device_->library();
  for (const auto& context : contexts_) {
    if (context->from_pack || context->keys.empty()) continue;
    NpuPackContext& c = out.emplace_back();
    c.binary = context->handle->binary();
    const HexagonBinaryInfo info = read_binary_info(lib, c.binary);
    for (const std::string& key : context->keys) {
      const Graph& graph = *graphs_.at(key);
      NpuPackGraph g{graph.graph.name(), key, graph.inputs, graph.outputs};
      for (const auto& d : info.graphs) {
        if (d.name != g.name) continue;
        g.const_bytes = d.const_bytes;
        g.io_bytes = d.io_bytes;
        g.spill_fill_bytes = d.spill_fill_bytes;
      }
      c.graphs.push_back(std::move(g));
    }
  }
  return out;
}

std::string HexagonBackend::name() const {
  const QnnLibrary& lib = device_->library();
  return "hexagon:v" + std::to_string(device_->chip().arch) + " (QNN build " + lib.build_id() +
         (lib.simulator() ? ", simulator" : "") +
         (options_.pack_id.empty() ? "" : ", pack " + options_.pack_id) +
         (options_.form == NpuForm::kF16 ? "" : ", " + std::string(npu_form_name(options_.form))) +
         ")";
}

// The weights stay where they lie until a graph takes them as constants; their ids name them in
// a graph's key.
void HexagonBackend::release_weights(const WeightList&) {
  holds_model_ = false;
  expected_constant_bytes_ = 0;
  failed_keys_.clear();  // keys name weights by id: the next model's are other weights
  graphs_.clear();       // they hold those weights as constants
  contexts_.clear();
}

void HexagonBackend::prepare_weights(const WeightList& weights) {
  // Its graphs name weights by id: another model's would be taken for them.
  if (holds_model_) {
    fail("hexagon", "this device backend holds another model's weights (it serves one at a time)");
  }
  holds_model_ = true;
  const std::vector<MatrixRef*>& matrices = weights.matrices;
  int64_t vocabulary = 0;
  for (const MatrixRef* m : matrices) vocabulary = std::max(vocabulary, m->rows);
  const double bytes_per_weight = options_.form == NpuForm::kF16     ? 2.0
                                  : options_.form == NpuForm::kW8A16 ? 1.0
                                                                     : 0.5;
  double bytes = 0;
  for (const MatrixRef* m : matrices) {
    if (m->rows < vocabulary) bytes += static_cast<double>(m->rows * m->cols) * bytes_per_weight;
  }
  expected_constant_bytes_ = static_cast<int64_t>(bytes);
}

WeightMemory HexagonBackend::weight_memory() const {
  WeightMemory w;
  for (const auto& c : contexts_) {
    w.copied_bytes += c->from_pack ? c->binary_bytes : c->const_estimate;
  }
  w.copied_bytes = std::max(w.copied_bytes, expected_constant_bytes_);
  w.host_copied_bytes = w.copied_bytes;
  return w;
}

DType HexagonBackend::computes_weights_as() const {
  switch (options_.form) {
    case NpuForm::kW8A16:
      return DType::kW8;
    case NpuForm::kW4A16:
      return DType::kW4;
    case NpuForm::kF16:
      break;
  }
  return DType::kF32;
}

const MatmulRanges* HexagonBackend::quantized(const MatrixRef& w) const {
  if (options_.form == NpuForm::kF16 || w.id < 0) return nullptr;
  const auto r = options_.ranges.find(w.id);
  return r != options_.ranges.end() ? &r->second : nullptr;
}

bool HexagonBackend::supports(const Node& node) const {
  if (node.op == Op::kCopy) return true;
  return row_wise_op(node.op) && node.rows >= kRows && node.rows % kRows == 0;
}

bool HexagonBackend::claims(const Node& node) const {
  return supports(node);
}

namespace {

// A node that writes the caller's memory (the logits, the final-norm rows): the lm-head and what
// feeds the reply stay with the CPU's model, so a pack never carries the lm-head.
// (On a device it writes its own copy of such a value, which a copy node then hands over.)
bool writes_callers_memory(const Plan& plan, const Node& node) {
  const ValueId out = node.out.value;
  if (plan.values[out].external()) return true;
  return std::any_of(plan.nodes.begin(), plan.nodes.end(), [&](const Node& n) {
    return n.op == Op::kCopy && n.in[0].value == out && plan.values[n.out.value].external();
  });
}

}  // namespace

void HexagonBackend::fuse(const Plan& plan, std::span<Node> nodes) const {
  // Every stretch of adjacent nodes but copies is one graph; a node that writes the caller's
  // memory is a run of its own, which compile refuses (so the scheduler moves it alone).
  for (size_t i = 0; i < nodes.size();) {
    size_t end = i + 1;
    if (nodes[i].op != Op::kCopy && !writes_callers_memory(plan, nodes[i])) {
      while (end < nodes.size() && nodes[end].op != Op::kCopy &&
             !writes_callers_memory(plan, nodes[end])) {
        ++end;
      }
    }
    nodes[i].fused = static_cast<int>(end - i - 1);
    i = end;
  }
}

std::shared_ptr<const CompiledRun> HexagonBackend::compile(const Plan& plan,
                                                           std::span<const Node> nodes) {
  if (nodes.front().op == Op::kCopy) return nullptr;  // a copy is a memcpy
  if (writes_callers_memory(plan, nodes.front())) {
    cannot("the caller's output (logits, final-norm rows) is the CPU's to write");
  }
  const int64_t rows = nodes.front().rows;
  const size_t begin = static_cast<size_t>(nodes.data() - plan.nodes.data());
  const size_t end = begin + nodes.size();

  // The run's values in order of first use, and which must leave the graph: those read after
  // the run (or bound by the caller).
  std::vector<ValueId> order;
  std::map<ValueId, size_t> number;
  const auto canonical = [&](ValueId v) {
    const auto [it, added] = number.emplace(v, order.size());
    if (added) order.push_back(v);
    return it->second;
  };
  const auto check = [&](const Operand& o) {
    const Value& v = plan.values[o.value];
    if (o.row != 0 || v.rows != rows) cannot("an operand at a row offset");
    canonical(o.value);
  };
  std::string key = "rows " + std::to_string(kRows);
  int64_t constant_bytes = 0;  // about what the graph's constants take (fp16 weights)
  for (const Node& n : nodes) {
    if (n.rows != rows) cannot("nodes of different row counts in one run");
    key += '|';
    key += op_name(n.op);
    for (const Operand& in : n.in) {
      if (in.value == kNoValue) continue;
      check(in);
      key += " i" + std::to_string(number[in.value]) + "x" +
             std::to_string(plan.values[in.value].cols);
    }
    check(n.out);
    key += " o" + std::to_string(number[n.out.value]) + "x" +
           std::to_string(plan.values[n.out.value].cols);
    if (n.matrix != nullptr) {
      const MatrixRef& m = *n.matrix;
      key += " w";
      if (m.id >= 0) {
        key += std::to_string(m.id);
      } else {  // weights no model numbered (the op suite's): named by their bytes
        Sha256 hash;
        hash.update(std::as_bytes(std::span(static_cast<const char*>(m.data),
                                            matrix_bytes(m.dtype, m.rows, m.cols, m.group_size))));
        if (m.scales != nullptr) {
          hash.update(
              std::as_bytes(std::span(static_cast<const char*>(m.scales),
                                      matrix_scale_bytes(m.dtype, m.rows, m.cols, m.group_size))));
        }
        key += hash.hex().substr(0, 16);
      }
      key += ":" + std::to_string(m.rows) + "x" + std::to_string(m.cols) + ":" +
             std::string(dtype_name(m.dtype));
      if (const MatmulRanges* r = quantized(m); r != nullptr) {
        Sha256 hash;  // the ranges its activations are encoded over
        hash.update(std::as_bytes(std::span(r, 1)));
        key += " " + std::string(npu_form_name(options_.form)) + " a" + hash.hex().substr(0, 12);
        constant_bytes += m.rows * m.cols;
      } else {
        constant_bytes += m.rows * m.cols * 2;
      }
    }
    if (n.vector != nullptr) {  // a norm's weights
      const WeightVector& v = *n.vector;
      if (v.id >= 0) {
        key += " v" + std::to_string(v.id);
      } else {  // weights no model numbered (the op suite's): named by their bytes
        Sha256 hash;
        hash.update(std::as_bytes(std::span(v.data(), static_cast<size_t>(n.width))));
        key += " v" + hash.hex().substr(0, 16);
      }
      constant_bytes += n.width * 4;
    }
    if (n.op == Op::kRmsNorm) {
      key += " w" + std::to_string(n.width) + " e" + std::to_string(std::bit_cast<uint32_t>(n.eps));
    }
    if (options_.perturb_op == op_name(n.op)) key += " perturbed";
  }
  // A value the run writes leaves it unless the plan writes it again before reading it (the
  // MLP's gate and up values): read later, or the plan's last word on it.
  std::vector<bool> leaves(order.size(), true), settled(order.size(), false);
  for (size_t j = end; j < plan.nodes.size(); ++j) {
    const Node& n = plan.nodes[j];
    const auto touch = [&](ValueId v, bool reads) {
      if (v == kNoValue || !number.contains(v) || settled[number[v]]) return;
      settled[number[v]] = true;
      leaves[number[v]] = reads || plan.values[v].external();
    };
    for (const Operand& in : n.in) touch(in.value, true);
    touch(n.out.value, updates_in_place(n.op));
    touch(n.out2.value, updates_out2_in_place(n.op));
  }
  for (size_t i = 0; i < leaves.size(); ++i) key += leaves[i] ? " L" : " -";

  auto compiled = std::make_shared<CompiledGraph>();
  compiled->first_run = true;
  for (size_t j = 0; j < begin; ++j) {
    if (plan.nodes[j].backend == nodes.front().backend && plan.nodes[j].op != Op::kCopy) {
      compiled->first_run = false;
      break;
    }
  }
  if (const auto known = options_.known_constant_bytes.find(key);
      known != options_.known_constant_bytes.end()) {
    constant_bytes = known->second;
  }
  if (failed_keys_.contains(key)) cannot("this run did not compile before");
  std::shared_ptr<Graph>& graph = graphs_[key];
  if (graph == nullptr) {
    try {
      graph = std::make_shared<Graph>(Graph{
          QnnGraph(context_for(constant_bytes), "qhx_graph_" + std::to_string(graph_names_++)),
          {},
          {}});
      contexts_.back()->keys.push_back(key);
      QnnGraph& g = graph->graph;
      // Each value's latest tensor in the graph; the last write of a value that leaves is an
      // output.
      std::vector<int64_t> current(order.size(), -1);
      std::vector<size_t> last_write(order.size(), SIZE_MAX);
      for (size_t i = 0; i < nodes.size(); ++i) last_write[number[nodes[i].out.value]] = i;
      const auto read = [&](ValueId v) {
        const size_t c = number[v];
        if (current[c] < 0) {
          current[c] = static_cast<int64_t>(g.input({dim(kRows), dim(plan.values[v].cols)}));
          graph->inputs.push_back(c);
        }
        return static_cast<QnnGraph::TensorId>(current[c]);
      };
      const auto write = [&](size_t node_index, ValueId v) {
        const size_t c = number[v];
        const std::vector<uint32_t> dims = {dim(kRows), dim(plan.values[v].cols)};
        QnnGraph::TensorId t;
        if (last_write[c] == node_index && leaves[c]) {
          t = g.output(dims);
          graph->outputs.push_back(c);
        } else {
          t = g.intermediate(dims);
        }
        return t;
      };
      for (size_t i = 0; i < nodes.size(); ++i) {
        const Node& n = nodes[i];
        const int64_t cols = plan.values[n.out.value].cols;
        QnnGraph::TensorId result = 0;
        const bool perturbed = options_.perturb_op == op_name(n.op);
        // The op's result goes to a fresh tensor; a perturbed op's through one more.
        const auto target = [&] {
          return perturbed ? g.intermediate({dim(kRows), dim(cols)}) : write(i, n.out.value);
        };
        switch (n.op) {
          case Op::kMatmul: {
            const MatrixRef& w = *n.matrix;
            const auto x = read(n.in[0].value);
            const MatmulRanges* ranges = quantized(w);
            if (ranges == nullptr) {
              // (The graph keeps its own copy of a constant until it is finalized.)
              std::vector<float> values(static_cast<size_t>(w.rows * w.cols));
              for (int64_t r = 0; r < w.rows; ++r) {
                ref::read_row(w, r, values.data() + r * w.cols);
              }
              const auto weights = g.constant({dim(w.rows), dim(w.cols)}, values);
              result = target();
              g.add("FullyConnected", {x, weights}, {result});
              break;
            }
            result = target();
            add_quantized_matmul(g, x, result, w, options_.form, *ranges, kRows);
            break;
          }
          case Op::kRmsNorm: {
            const auto x = read(n.in[0].value);
            const auto weight = g.constant({dim(n.width)}, std::span(n.vector->data(), n.width));
            const uint32_t axis_values[] = {1};
            if (n.width == cols) {
              const auto axes = g.constant_u32({1}, axis_values);
              result = target();
              g.add("RmsNorm", {x, weight}, {result}, {{"epsilon", QnnGraph::f32(n.eps)}},
                    {{"axes", axes}});
            } else {
              // Every `width` elements of the chunk (per head): [rows · cols / width, width],
              // normalized over each row.
              if (kRows * cols % n.width != 0) cannot("a norm width that does not divide a chunk");
              const std::vector<uint32_t> heads = {dim(kRows * cols / n.width), dim(n.width)};
              const auto split = g.intermediate(heads);
              g.add("Reshape", {x}, {split});
              const auto normed = g.intermediate(heads);
              const auto axes = g.constant_u32({1}, axis_values);
              g.add("RmsNorm", {split, weight}, {normed}, {{"epsilon", QnnGraph::f32(n.eps)}},
                    {{"axes", axes}});
              result = target();
              g.add("Reshape", {normed}, {result});
            }
            break;
          }
          case Op::kAdd: {
            const auto sum = read(n.out.value), term = read(n.in[0].value);
            result = target();
            g.add("ElementWiseAdd", {sum, term}, {result});
            break;
          }
          case Op::kSiluMul: {
            const auto gate = read(n.in[0].value), up = read(n.in[1].value);
            const auto sigmoid = g.intermediate({dim(kRows), dim(cols)});
            g.add("Sigmoid", {gate}, {sigmoid});
            const auto silu = g.intermediate({dim(kRows), dim(cols)});
            g.add("ElementWiseMultiply", {gate, sigmoid}, {silu});
            result = target();
            g.add("ElementWiseMultiply", {silu, up}, {result});
            break;
          }
          case Op::kSigmoidGate: {
            const auto x = read(n.out.value), gate = read(n.in[0].value);
            const auto sigmoid = g.intermediate({dim(kRows), dim(cols)});
            g.add("Sigmoid", {gate}, {sigmoid});
            result = target();
            g.add("ElementWiseMultiply", {x, sigmoid}, {result});
            break;
          }
          default:
            cannot(std::string("op ") + op_name(n.op));
        }
        if (perturbed) {
          const float bump[] = {0.25f};
          const auto offset = g.constant({1}, bump);
          const auto out = write(i, n.out.value);
          g.add("ElementWiseAdd", {result, offset}, {out});
          result = out;
        }
        current[number[n.out.value]] = static_cast<int64_t>(result);
      }
      g.finalize();
      ++graphs_compiled_;
    } catch (const std::exception& e) {
      // The graph is left unfinished in its context: no more graphs go there, and the run is
      // not tried again: the scheduler runs it on the CPU, whatever the reason.
      graphs_.erase(key);
      failed_keys_.insert(key);
      if (!contexts_.empty() && !contexts_.back()->keys.empty() &&
          contexts_.back()->keys.back() == key) {
        contexts_.back()->keys.pop_back();
        contexts_.back()->retired = true;
      }
      compile_failures_.push_back(e.what());
      const auto* error = dynamic_cast<const Error*>(&e);
      if (error != nullptr && error->kind() == ErrorKind::kDeviceFailed) throw;
      throw Error(std::string("hexagon: ") + e.what(), ErrorKind::kDeviceFailed);
    }
  }
  compiled->graph = graph;
  // A graph from a pack names the run's values by number: they must be this run's.
  for (const auto& [numbers, values] : {std::pair{&graph->inputs, &compiled->inputs},
                                        std::pair{&graph->outputs, &compiled->outputs}}) {
    for (const size_t c : *numbers) {
      if (c >= order.size()) cannot("a packed graph names a value its run does not have");
      values->push_back(order[c]);
    }
  }
  for (size_t i = 0; i < compiled->inputs.size(); ++i) {
    if (graph->graph.input_dims(i)[1] != plan.values[compiled->inputs[i]].cols) {
      cannot("a packed graph's input of another width than its value");
    }
  }
  for (size_t o = 0; o < compiled->outputs.size(); ++o) {
    if (graph->graph.output_dims(o)[1] != plan.values[compiled->outputs[o]].cols) {
      cannot("a packed graph's output of another width than its value");
    }
  }
  return compiled;
}

Buffer& HexagonBackend::arena(size_t bytes) {
  if (arena_ == nullptr || arena_->bytes() < bytes) arena_ = memory_.allocate(bytes);
  return *arena_;
}

void HexagonBackend::run(const Plan& plan, std::span<const Node> nodes, const NodeArgs& args) {
  const Node& head = nodes.front();
  if (head.op == Op::kCopy) {
    const int64_t cols = plan.values[head.out.value].cols;
    std::memcpy(args.at(head.out), args.at(head.in[0]),
                static_cast<size_t>(head.rows * cols) * sizeof(float));
    return;
  }
  const auto* compiled = dynamic_cast<const CompiledGraph*>(args.compiled);
  if (compiled == nullptr) fail("hexagon", "a run that was not compiled");
  std::vector<std::span<const float>> in(compiled->inputs.size());
  std::vector<std::span<float>> out(compiled->outputs.size());
  for (int64_t chunk = 0; chunk < head.rows / kRows; ++chunk) {
    const auto slice = [&](ValueId v) {
      const int64_t cols = plan.values[v].cols;
      return std::span<float>(args.at({v, chunk * kRows}), static_cast<size_t>(kRows * cols));
    };
    for (size_t i = 0; i < in.size(); ++i) in[i] = slice(compiled->inputs[i]);
    for (size_t o = 0; o < out.size(); ++o) out[o] = slice(compiled->outputs[o]);
    if (++executions_ == options_.fail_execution) {
      throw Error("hexagon: graph execution " + std::to_string(executions_) +
                      " failed (QHX_HEXAGON_FAIL_EXECUTION)",
                  ErrorKind::kDeviceFailed);
    }
    compiled->graph->graph.execute(in, out);
    if (compiled->first_run) ++chunks_;
  }
}

}  // namespace qhx
