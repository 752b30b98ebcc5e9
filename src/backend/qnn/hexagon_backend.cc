#include "backend/qnn/hexagon_backend.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <functional>
#include <optional>
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

// What a decode step runs here: every op but the embedding (the host looks it up) and the
// delta rule's gates — softplus and exp of values near 0 lose too much in fp16 (up to half of a
// small softplus), and they are a few numbers per head: the host computes them in f32.
// The vision tower's ops are not compiled into packs.
bool decode_op(Op op) {
  switch (op) {
    case Op::kEmbed:
    case Op::kDeltaGates:
    case Op::kLayerNorm:
    case Op::kAddBias:
    case Op::kGelu:
    case Op::kGeluTanh:
    case Op::kBidirectionalAttention:
      return false;
    default:
      return true;
  }
}

// The ops that carry a sequence's state (attention over the KV cache, the Gated DeltaNet's conv
// and delta rule): runs of their own, with the state as graph input (and output) from the
// host's memory.
constexpr Op kStateOps[] = {Op::kAttention, Op::kConvSilu, Op::kDeltaRule};
bool carries_state(Op op) {
  return std::find(std::begin(kStateOps), std::end(kStateOps), op) != std::end(kStateOps);
}

// Whether a graph's key (state_graph's: the op's name first) is a state op's.
bool carries_state_key(std::string_view key) {
  const std::string_view name = key.substr(0, key.find(' '));
  return std::any_of(std::begin(kStateOps), std::end(kStateOps),
                     [&](Op op) { return name == op_name(op); });
}

// The rows of a run's graph: a prompt chunk's, or a decode step's one.
int64_t graph_rows(int64_t rows) {
  return rows == 1 ? 1 : kRows;
}

// The attention graphs' cache lengths: powers of two from kRows, the smallest that holds the
// cache with the new row (attention costs what the bucket holds, at most twice the cache).
int64_t cache_bucket(int64_t rows) {
  return std::max<int64_t>(kRows, std::bit_ceil(static_cast<uint64_t>(rows)));
}

// A masked score: finite (an HTP softmax of -inf is not), far below any real one.
constexpr float kMasked = -10000.0f;

// Refuses a run this backend cannot compile: the scheduler then places it on the CPU.
[[noreturn]] void cannot(const std::string& why) {
  throw Error("hexagon: " + why, ErrorKind::kDeviceFailed);
}

uint32_t dim(int64_t n) {
  if (n <= 0 || n > UINT32_MAX) cannot("a dimension of " + std::to_string(n));
  return static_cast<uint32_t>(n);
}

// A weight vector in a graph's key: by its id, or (weights no model numbered: the op suite's)
// by its bytes.
std::string weight_name(const WeightVector& v) {
  if (v.id >= 0) return std::to_string(v.id);
  Sha256 hash;
  hash.update(std::as_bytes(std::span(v.data(), static_cast<size_t>(v.size()))));
  return hash.hex().substr(0, 16);
}

// out = x over `rows` rows of `cols`, each `width` elements (a row, or a head of it) RMS-normed
// with `weight` and `eps`.
void add_rms_norm(QnnGraph& g, QnnGraph::TensorId x, QnnGraph::TensorId out, int64_t rows,
                  int64_t cols, int64_t width, std::span<const float> weight, float eps) {
  if (rows * cols % width != 0) cannot("a norm width that does not divide a chunk");
  const uint32_t axis_values[] = {1};
  const auto norm = [&](QnnGraph::TensorId in, QnnGraph::TensorId normed) {
    g.add("RmsNorm", {in, g.constant({dim(width)}, weight)}, {normed},
          {{"epsilon", QnnGraph::f32(eps)}}, {{"axes", g.constant_u32({1}, axis_values)}});
  };
  if (width == cols) return norm(x, out);
  const std::vector<uint32_t> heads = {dim(rows * cols / width), dim(width)};
  const auto split = g.intermediate(heads), normed = g.intermediate(heads);
  g.add("Reshape", {x}, {split});
  norm(split, normed);
  g.add("Reshape", {normed}, {out});
}

// out = columns [first, first + count) of x's `rows` rows.
void add_columns(QnnGraph& g, QnnGraph::TensorId x, QnnGraph::TensorId out, int64_t rows,
                 int64_t first, int64_t count) {
  const int32_t ranges[] = {0,
                            static_cast<int32_t>(dim(rows)),
                            1,
                            static_cast<int32_t>(first),
                            static_cast<int32_t>(first + count),
                            1};
  g.add("StridedSlice", {x}, {out}, {}, {{"ranges", g.constant_i32({2, 3}, ranges)}});
}

// out = x + 0.25: what the perturbation test switch makes of an op's result.
void add_perturbation(QnnGraph& g, QnnGraph::TensorId x, QnnGraph::TensorId out) {
  const float bump[] = {0.25f};
  g.add("ElementWiseAdd", {x, g.constant({1}, bump)}, {out});
}

}  // namespace

// One compiled graph: kChunkRows rows of a run (1 for a decode step), its inputs and outputs in
// the order the graph binds them, each named by its position among the run's values (first read
// or write order). The RoPE nodes' rotation tables (computed from the positions as it runs)
// come first among its inputs, two per node; an attention graph's inputs are the queries, then
// the cache's keys and values and the mask, and it has no value numbers.
struct HexagonBackend::Graph {
  QnnGraph graph;
  std::vector<size_t> inputs, outputs;  // canonical value numbers
  std::vector<size_t> rope_nodes;       // the run's RoPE nodes, by index in the run
};

namespace {

// A compiled run as a schedule keeps it: the graph and which of the plan's values each of its
// inputs and outputs is.
struct CompiledGraph final : CompiledRun {
  std::shared_ptr<HexagonBackend::Graph> graph;  // null for attention: one per cache length
  std::vector<ValueId> inputs, outputs;
  int64_t rows = kRows;    // of its graph
  bool first_run = false;  // the plan's first run here: each of its chunks is a prompt chunk
};

// RoPE as the graph computes it, per head of `width` elements: x · C + (x · P) · S, where x · P
// is rotate_half (a signed permutation of the first rotary_dim elements, exact in fp16) and C, S
// hold each position's cos and sin (1 and 0 past rotary_dim), row by row as the heads lie.
std::vector<float> rotate_half_matrix(int64_t width, int64_t rotary_dim) {
  std::vector<float> p(static_cast<size_t>(width * width), 0.0f);
  const int64_t half = rotary_dim / 2;
  for (int64_t i = 0; i < half; ++i) {
    p[(i + half) * width + i] = -1.0f;  // out[i] = -x[i + half]
    p[i * width + i + half] = 1.0f;     // out[i + half] = x[i]
  }
  return p;
}

// The C and S tables of a RoPE node over `rows` rows from position `first`, the angles as the
// CPU computes them (f32 position · frequency).
void rope_tables(const Node& rope, int64_t rows, int64_t heads, int64_t first,
                 std::vector<float>& cos, std::vector<float>& sin) {
  const int64_t width = rope.width, half = rope.rotary_dim / 2;
  cos.assign(static_cast<size_t>(rows * heads * width), 1.0f);
  sin.assign(cos.size(), 0.0f);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < half; ++i) {
      const float angle = static_cast<float>(first + r) * (*rope.vector)[i];
      const float c = std::cos(angle), s = std::sin(angle);
      for (int64_t h = 0; h < heads; ++h) {
        float* row_cos = cos.data() + (r * heads + h) * width;
        float* row_sin = sin.data() + (r * heads + h) * width;
        row_cos[i] = row_cos[i + half] = c;
        row_sin[i] = row_sin[i + half] = s;
      }
    }
  }
}

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
      // A run's graph ("rows R|op ...|op ..."): its inputs as the binary has them are two RoPE
      // tables per RoPE node of the run, then one per value the manifest names, each R rows, no
      // value named twice. A state op's graph (attention's per cache length, the conv's, the
      // delta rule's) is bound by position, not by value.
      std::vector<size_t> rope_nodes;
      if (g.key.starts_with("rows ")) {
        const int64_t rows = std::atoll(g.key.c_str() + 5);
        size_t node = 0;
        for (size_t bar = g.key.find('|'); bar != std::string::npos;
             bar = g.key.find('|', bar + 1), ++node) {
          if (g.key.compare(bar + 1, 5, "rope ") == 0) rope_nodes.push_back(node);
        }
        const size_t tables = 2 * rope_nodes.size();
        std::set<size_t> inputs(g.inputs.begin(), g.inputs.end()),
            outputs(g.outputs.begin(), g.outputs.end());
        bool fits = (rows == 1 || rows == kRows) &&
                    tables + g.inputs.size() == described->inputs.size() &&
                    g.outputs.size() == described->outputs.size() &&
                    inputs.size() == g.inputs.size() && outputs.size() == g.outputs.size();
        for (size_t i = 0; i < described->inputs.size() + described->outputs.size(); ++i) {
          const bool input = i < described->inputs.size();
          const HexagonBinaryInfo::Tensor& t =
              input ? described->inputs[i] : described->outputs[i - described->inputs.size()];
          const bool table = input && i < tables;  // [rows · heads, head width]
          fits = fits && t.dims.size() == 2 &&
                 (table ? t.dims[0] % rows == 0 : t.dims[0] == static_cast<uint32_t>(rows));
        }
        if (!fits) fail("NPU pack", "graph " + g.name + " does not match its context binary");
      } else if (!g.inputs.empty() || !g.outputs.empty() || !carries_state_key(g.key)) {
        fail("NPU pack", "graph " + g.name + " is neither a run's nor a state op's");
      }
      if (graphs_.count(g.key) != 0) fail("NPU pack", "graph " + g.name + " twice");
      graphs_[g.key] =
          std::make_shared<Graph>(Graph{QnnGraph::retrieve(*context->handle, *described), g.inputs,
                                        g.outputs, std::move(rope_nodes)});
      context->keys.push_back(g.key);
      ++graphs_from_pack_;
    }
  }
}

HexagonBackend::~HexagonBackend() {
  graphs_.clear();  // before their contexts
  contexts_.clear();
}

bool HexagonBackend::shares_weights() const {
  if (!options_.decode || sharing_refused_) return false;
  for (const auto& c : contexts_) {
    if (c->from_pack) return false;
  }
  return true;
}

HexagonBackend::Context& HexagonBackend::context_for(const GraphWeights& weights, int64_t bytes) {
  const bool sharing = shares_weights();
  const auto new_bytes = [&](const Context& c) {
    if (!sharing) return bytes;
    int64_t unseen = 0;
    for (const auto& [name, size] : weights) unseen += c.weights.contains(name) ? 0 : size;
    return unseen;
  };
  const auto open = [&](const Context& c) { return !c.from_pack && !c.retired; };
  Context* chosen = nullptr;
  if (sharing) {
    int64_t most = 0;
    for (const auto& c : contexts_) {
      if (!open(*c)) continue;
      const int64_t held = bytes - new_bytes(*c);
      if (held > most && c->const_estimate + new_bytes(*c) <= options_.context_budget_bytes) {
        most = held;
        chosen = c.get();
      }
    }
  }
  if (chosen == nullptr) {
    if (contexts_.empty() || !open(*contexts_.back()) ||
        (!contexts_.back()->keys.empty() &&
         contexts_.back()->const_estimate + new_bytes(*contexts_.back()) >
             options_.context_budget_bytes)) {
      auto context = std::make_unique<Context>();
      try {
        context->handle = std::make_unique<HexagonContext>(device_, sharing);
        context->shares = sharing;
      } catch (const Error&) {
        if (!sharing) throw;  // (nothing was added)
        // An HTP that will not share weights still runs the graphs, each with its own.
        sharing_refused_ = true;
        context->handle = std::make_unique<HexagonContext>(device_);
      }
      contexts_.push_back(std::move(context));
    }
    chosen = contexts_.back().get();
  }
  chosen->const_estimate += new_bytes(*chosen);
  for (const auto& [name, size] : weights) chosen->weights.insert(name);
  return *chosen;
}

std::vector<NpuPackContext> HexagonBackend::export_contexts() const {
  std::vector<NpuPackContext> out;
  const QnnLibrary& lib = device_->library();
  for (const auto& context : contexts_) {
    if (context->from_pack || context->keys.empty()) continue;
    NpuPackContext& c = out.emplace_back();
    c.shares_weights = context->shares;
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

void HexagonBackend::compile_attention_lengths(int64_t context) {
  for (const Node& n : attention_nodes_) {
    for (int64_t length = kRows; length <= cache_bucket(context); length *= 2) {
      state_graph(n, length);
    }
  }
}

std::string HexagonBackend::name() const {
  const QnnLibrary& lib = device_->library();
  return "hexagon:v" + std::to_string(device_->chip().arch) + " (QNN build " + lib.build_id() +
         (lib.simulator() ? ", simulator" : "") +
         (options_.pack_id.empty() ? "" : ", pack " + options_.pack_id) +
         (options_.form == NpuForm::kF16 ? "" : ", " + std::string(npu_form_name(options_.form))) +
         (options_.decode ? ", decoding" : "") + ")";
}

// The weights stay where they lie until a graph takes them as constants; their ids name them in
// a graph's key.
void HexagonBackend::release_weights(const WeightList&) {
  holds_model_ = false;
  expected_constant_bytes_ = 0;
  failed_keys_.clear();  // keys name weights by id: the next model's are other weights
  graphs_.clear();       // they hold those weights as constants
  contexts_.clear();
  attention_nodes_.clear();
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
  // The layers' matrices are constants of the prompt graphs, shared by the decode graphs when it
  // decodes — unless the prompt graphs came from a pack: then the decode graphs hold them again;
  // the lm-head (the largest) is a graph of its own only when it decodes.
  const double layer_copies = options_.decode && !shares_weights() ? 2 : 1;
  double bytes = 0;
  for (const MatrixRef* m : matrices) {
    const double copies = m->rows == vocabulary ? (options_.decode ? 1 : 0) : layer_copies;
    bytes += copies * static_cast<double>(m->rows * m->cols) * bytes_per_weight;
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
  if (node.op == Op::kRope && node.rope_axes != nullptr) return false;  // M-RoPE: the CPU's
  if (node.rows == 1) {  // a decode step's node (or a prompt's last row: its lm-head)
    if (!options_.decode || !decode_op(node.op)) return false;
    for (const Operand* o : {&node.in[0], &node.in[1], &node.in[2], &node.out}) {
      if (o->row != 0) return false;  // graphs read and write whole values
    }
    const AttentionShape& a = node.attention;
    const DeltaRuleShape& h = node.heads;
    if (node.op == Op::kAttention) {  // f32 caches (quantized rows are the CPU kernels')
      return a.kv == KvType::kF32 && a.n_kv_heads > 0 && a.n_heads % a.n_kv_heads == 0;
    }
    if (node.op == Op::kDeltaRule) return h.n_k_heads > 0 && h.n_v_heads % h.n_k_heads == 0;
    return true;
  }
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
  // Every stretch of adjacent nodes but copies is one graph. Runs of their own: a node that
  // writes the caller's memory (the lm-head: a graph of its own when decoding here, else refused
  // by compile so the scheduler moves it alone), and attention, whose graphs go by the cache's
  // length and hold no weights (the weights are not compiled again per length).
  const auto alone = [&](const Node& n) {
    return n.op == Op::kCopy || carries_state(n.op) || writes_callers_memory(plan, n);
  };
  for (size_t i = 0; i < nodes.size();) {
    size_t end = i + 1;
    if (!alone(nodes[i])) {
      while (end < nodes.size() && !alone(nodes[end])) ++end;
    }
    nodes[i].fused = static_cast<int>(end - i - 1);
    i = end;
  }
}

std::shared_ptr<const CompiledRun> HexagonBackend::compile(const Plan& plan,
                                                           std::span<const Node> nodes) {
  if (nodes.front().op == Op::kCopy) return nullptr;  // a copy is a memcpy
  const int64_t rows = nodes.front().rows;
  if (writes_callers_memory(plan, nodes.front()) && rows != 1) {
    cannot("the caller's output (logits, final-norm rows) of a prompt is the CPU's to write");
  }
  if (carries_state(nodes.front().op)) {  // its graph is found as it runs (attention's by length)
    const Node& n = nodes.front();
    if (rows != 1) cannot("a state's op over a prompt");
    // Compiled now, so that a shape the HTP cannot take goes to the CPU: the conv's and the
    // delta rule's graphs, and attention's first length (longer ones compile as the cache
    // reaches them; one that fails then is the device failing, and the CPU takes over).
    state_graph(n, n.op == Op::kConvSilu ? plan.values[n.out.value].cols : kRows);
    const auto same_shape = [&](const Node& seen) {
      return seen.attention.n_heads == n.attention.n_heads &&
             seen.attention.n_kv_heads == n.attention.n_kv_heads &&
             seen.attention.head_dim == n.attention.head_dim && seen.scale == n.scale;
    };
    if (n.op == Op::kAttention &&
        std::none_of(attention_nodes_.begin(), attention_nodes_.end(), same_shape)) {
      attention_nodes_.push_back(n);
    }
    auto compiled = std::make_shared<CompiledGraph>();
    compiled->rows = 1;
    return compiled;
  }
  const int64_t R = graph_rows(rows);
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
  std::string key = "rows " + std::to_string(R);
  int64_t constant_bytes = 0;  // about what the graph's constants take (fp16 weights)
  GraphWeights weights;
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
    for (const Operand* out : {&n.out, &n.out2}) {
      if (out->value == kNoValue) continue;
      check(*out);
      key += " o" + std::to_string(number[out->value]) + "x" +
             std::to_string(plan.values[out->value].cols);
    }
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
      const size_t weight_begin = key.rfind(" w");
      const MatmulRanges* r = quantized(m);
      const int64_t bytes = r != nullptr ? m.rows * m.cols : m.rows * m.cols * 2;
      weights.emplace_back(key.substr(weight_begin + 1) + (r != nullptr ? " q" : " h"), bytes);
      constant_bytes += bytes;
      if (r != nullptr) {
        Sha256 hash;  // the ranges its activations are encoded over
        hash.update(std::as_bytes(std::span(r, 1)));
        key += " " + std::string(npu_form_name(options_.form)) + " a" + hash.hex().substr(0, 12);
      }
    }
    for (const WeightVector* v : {n.vector, n.vector2}) {  // a norm's, conv's, gates' weights
      if (v == nullptr) continue;
      key += " v" + weight_name(*v);
      weights.emplace_back("v" + weight_name(*v), v->size() * 4);
      constant_bytes += v->size() * 4;
    }
    if (n.op == Op::kRmsNorm) {
      key += " w" + std::to_string(n.width) + " e" + std::to_string(std::bit_cast<uint32_t>(n.eps));
    }
    if (n.op == Op::kRope || n.op == Op::kSplitHeads || n.op == Op::kL2Norm ||
        n.op == Op::kCopyColumns) {
      key += " w" + std::to_string(n.width) + " r" + std::to_string(n.rotary_dim) + " c" +
             std::to_string(n.offset) + " s" + std::to_string(std::bit_cast<uint32_t>(n.scale));
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
  compiled->rows = R;
  compiled->first_run = true;
  for (size_t j = 0; j < begin; ++j) {
    if (plan.nodes[j].backend == nodes.front().backend && plan.nodes[j].op != Op::kCopy) {
      compiled->first_run = false;
      break;
    }
  }
  // Counted as a prompt chunk or a decode step (not a prompt's last-row lm-head).
  compiled->first_run = compiled->first_run && (R == kRows || plan.n_tokens == 1);
  if (const auto known = options_.known_constant_bytes.find(key);
      known != options_.known_constant_bytes.end()) {
    constant_bytes = known->second;
  }
  if (failed_keys_.contains(key)) cannot("this run did not compile before");
  std::shared_ptr<Graph>& graph = graphs_[key];
  if (graph == nullptr) {
    try {
      Context& context = context_for(weights, constant_bytes);
      graph = std::make_shared<Graph>(Graph{
          QnnGraph(*context.handle, "qhx_graph_" + std::to_string(graph_names_++)), {}, {}, {}});
      context.keys.push_back(key);
      QnnGraph& g = graph->graph;
      // Each value's latest tensor in the graph; the last write of a value that leaves is an
      // output.
      std::vector<int64_t> current(order.size(), -1);
      std::vector<size_t> last_write(order.size(), SIZE_MAX);
      for (size_t i = 0; i < nodes.size(); ++i) {
        last_write[number[nodes[i].out.value]] = i;
        if (nodes[i].out2.value != kNoValue) last_write[number[nodes[i].out2.value]] = i;
      }
      // The RoPE nodes' tables, the graph's first inputs.
      std::vector<std::pair<QnnGraph::TensorId, QnnGraph::TensorId>> tables(nodes.size());
      for (size_t i = 0; i < nodes.size(); ++i) {
        if (nodes[i].op != Op::kRope) continue;
        const int64_t cols = plan.values[nodes[i].out.value].cols;
        if (cols % nodes[i].width != 0) cannot("RoPE heads that do not divide a row");
        const std::vector<uint32_t> heads = {dim(R * cols / nodes[i].width), dim(nodes[i].width)};
        tables[i] = {g.input(heads), g.input(heads)};
        graph->rope_nodes.push_back(i);
      }
      const auto read = [&](ValueId v) {
        const size_t c = number[v];
        if (current[c] < 0) {
          current[c] = static_cast<int64_t>(g.input({dim(R), dim(plan.values[v].cols)}));
          graph->inputs.push_back(c);
        }
        return static_cast<QnnGraph::TensorId>(current[c]);
      };
      const auto write = [&](size_t node_index, ValueId v) {
        const size_t c = number[v];
        const std::vector<uint32_t> dims = {dim(R), dim(plan.values[v].cols)};
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
        std::optional<QnnGraph::TensorId> second;  // what it writes to out2
        const bool perturbed = options_.perturb_op == op_name(n.op);
        // The op's result goes to a fresh tensor; a perturbed op's through one more.
        const auto target = [&] {
          return perturbed ? g.intermediate({dim(R), dim(cols)}) : write(i, n.out.value);
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
            add_quantized_matmul(g, x, result, w, options_.form, *ranges, dim(R));
            break;
          }
          case Op::kRmsNorm: {
            const auto x = read(n.in[0].value);
            result = target();
            add_rms_norm(g, x, result, R, cols, n.width, std::span(n.vector->data(), n.width),
                         n.eps);
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
            const auto sigmoid = g.intermediate({dim(R), dim(cols)});
            g.add("Sigmoid", {gate}, {sigmoid});
            const auto silu = g.intermediate({dim(R), dim(cols)});
            g.add("ElementWiseMultiply", {gate, sigmoid}, {silu});
            result = target();
            g.add("ElementWiseMultiply", {silu, up}, {result});
            break;
          }
          case Op::kSigmoidGate: {
            const auto x = read(n.out.value), gate = read(n.in[0].value);
            const auto sigmoid = g.intermediate({dim(R), dim(cols)});
            g.add("Sigmoid", {gate}, {sigmoid});
            result = target();
            g.add("ElementWiseMultiply", {x, sigmoid}, {result});
            break;
          }
          case Op::kRope: {
            const auto x = read(n.out.value);
            const std::vector<uint32_t> heads = {dim(R * cols / n.width), dim(n.width)};
            const auto xh = g.intermediate(heads);
            g.add("Reshape", {x}, {xh});
            const auto rotate =
                g.constant({dim(n.width), dim(n.width)}, rotate_half_matrix(n.width, n.rotary_dim));
            const auto rotated = g.intermediate(heads);
            g.add("MatMul", {xh, rotate}, {rotated});
            const auto cos = g.intermediate(heads), sin = g.intermediate(heads);
            g.add("ElementWiseMultiply", {xh, tables[i].first}, {cos});
            g.add("ElementWiseMultiply", {rotated, tables[i].second}, {sin});
            const auto sum = g.intermediate(heads);
            g.add("ElementWiseAdd", {cos, sin}, {sum});
            result = target();
            g.add("Reshape", {sum}, {result});
            break;
          }
          case Op::kCopyColumns: {
            const auto x = read(n.in[0].value);
            result = target();
            add_columns(g, x, result, R, n.offset, cols);
            break;
          }
          case Op::kSplitHeads: {
            // [rows · heads, 2 · width]: the first half of each row the queries, the second the
            // gates.
            const auto x = read(n.in[0].value);
            const uint32_t heads = dim(R * cols / n.width), w = dim(n.width);
            const auto both = g.intermediate({heads, 2 * w});
            g.add("Reshape", {x}, {both});
            const auto half = [&](int64_t first) {
              const auto part = g.intermediate({heads, w});
              add_columns(g, both, part, heads, first, w);
              return part;
            };
            const auto queries = half(0), gates = half(w);
            result = target();
            g.add("Reshape", {queries}, {result});
            second = write(i, n.out2.value);
            g.add("Reshape", {gates}, {*second});
            break;
          }
          case Op::kL2Norm: {
            // x / sqrt(Σx² + ε) · scale is RMSNorm with ε/width and weights scale / sqrt(width).
            const auto x = read(n.out.value);
            const std::vector<float> weight(static_cast<size_t>(n.width),
                                            n.scale / std::sqrt(static_cast<float>(n.width)));
            result = target();
            add_rms_norm(g, x, result, R, cols, n.width, weight,
                         1e-6f / static_cast<float>(n.width));
            break;
          }
          default:
            cannot(std::string("op ") + op_name(n.op));
        }
        if (perturbed) {
          const auto out = write(i, n.out.value);
          add_perturbation(g, result, out);
          result = out;
        }
        current[number[n.out.value]] = static_cast<int64_t>(result);
        if (second) current[number[n.out2.value]] = static_cast<int64_t>(*second);
      }
      g.finalize();
      ++graphs_compiled_;
    } catch (const std::exception& e) {
      compile_failed(key, e);
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
  const size_t tables = 2 * graph->rope_nodes.size();
  for (size_t i = 0; i < compiled->inputs.size(); ++i) {
    if (graph->graph.input_dims(tables + i)[1] != plan.values[compiled->inputs[i]].cols) {
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
  if (compiled->graph == nullptr) return run_with_state(head, args);
  Graph& graph = *compiled->graph;
  const int64_t R = compiled->rows;
  const size_t tables = 2 * graph.rope_nodes.size();
  std::vector<std::vector<float>> table_data(tables);
  std::vector<std::span<const float>> in(tables + compiled->inputs.size());
  std::vector<std::span<float>> out(compiled->outputs.size());
  for (int64_t chunk = 0; chunk < head.rows / R; ++chunk) {
    const auto slice = [&](ValueId v) {
      const int64_t cols = plan.values[v].cols;
      return std::span<float>(args.at({v, chunk * R}), static_cast<size_t>(R * cols));
    };
    for (size_t k = 0; k < graph.rope_nodes.size(); ++k) {
      const Node& rope = nodes[graph.rope_nodes[k]];
      rope_tables(rope, R, plan.values[rope.out.value].cols / rope.width,
                  args.inputs->first_pos + chunk * R, table_data[2 * k], table_data[2 * k + 1]);
      in[2 * k] = table_data[2 * k];
      in[2 * k + 1] = table_data[2 * k + 1];
    }
    for (size_t i = 0; i < compiled->inputs.size(); ++i)
      in[tables + i] = slice(compiled->inputs[i]);
    for (size_t o = 0; o < out.size(); ++o) out[o] = slice(compiled->outputs[o]);
    execute(graph, in, out);
    if (compiled->first_run) ++(R == 1 ? steps_ : chunks_);
  }
}

void HexagonBackend::compile_failed(const std::string& key, const std::exception& e) {
  // The graph is left unfinished in its context: no more graphs go there, and the run is not
  // tried again: the scheduler runs it on the CPU, whatever the reason.
  graphs_.erase(key);
  failed_keys_.insert(key);
  for (const auto& c : contexts_) {
    if (c->keys.empty() || c->keys.back() != key) continue;
    c->keys.pop_back();
    c->retired = true;
  }
  compile_failures_.push_back(e.what());
  const auto* error = dynamic_cast<const Error*>(&e);
  if (error != nullptr && error->kind() == ErrorKind::kDeviceFailed) throw Error(*error);
  throw Error(std::string("hexagon: ") + e.what(), ErrorKind::kDeviceFailed);
}

void HexagonBackend::execute(Graph& graph, std::span<const std::span<const float>> in,
                             std::span<const std::span<float>> out) {
  if (++executions_ == options_.fail_execution) {
    throw Error("hexagon: graph execution " + std::to_string(executions_) +
                    " failed (QHX_HEXAGON_FAIL_EXECUTION)",
                ErrorKind::kDeviceFailed);
  }
  if (!options_.compile_only) graph.graph.execute(in, out);
}

void HexagonBackend::run_with_state(const Node& n, const NodeArgs& args) {
  LayerState& layer = args.inputs->layers[n.layer];
  switch (n.op) {
    case Op::kAttention:
      return run_attention(n, args);
    case Op::kConvSilu: {
      // The conv state holds the last kernel − 1 inputs: the graph reads it and the new row, and
      // the host then shifts the new row in (only after the graph ran: a failed step leaves the
      // state as the CPU will redo it from).
      const int64_t channels = args.values[n.out.value].shape[1], history = n.width - 1;
      StateBuffer& state = layer.conv;
      if (state.size() != history * channels) fail("hexagon", "a conv state of another size");
      Graph& graph = state_graph(n, channels);
      const float* x = args.at(n.in[0]);
      const std::span<const float> in[] = {{x, static_cast<size_t>(channels)}, state.host_span()};
      const std::span<float> out[] = {{args.at(n.out), static_cast<size_t>(channels)}};
      execute(graph, in, out);
      float* rows = state.data();
      std::copy(rows + channels, rows + history * channels, rows);
      std::copy_n(x, channels, rows + (history - 1) * channels);
      return;
    }
    case Op::kDeltaRule: {
      // The recurrent state in and out: written back from the graph's output once it ran.
      const DeltaRuleShape& h = n.heads;
      StateBuffer& state = layer.recurrent;
      const int64_t floats = h.n_v_heads * h.k_dim * h.v_dim;
      if (state.size() != floats) fail("hexagon", "a recurrent state of another size");
      Graph& graph = state_graph(n, 0);
      const auto span_of = [&](const Operand& o) {
        return std::span<const float>(args.at(o),
                                      static_cast<size_t>(args.values[o.value].shape[1]));
      };
      state_out_.resize(static_cast<size_t>(floats));
      const std::span<const float> in[] = {span_of(n.in[0]), span_of(n.in[1]), span_of(n.in[2]),
                                           span_of(n.in[3]), span_of(n.in[4]), state.host_span()};
      const std::span<float> out[] = {state_out_,
                                      {args.at(n.out), static_cast<size_t>(h.n_v_heads * h.v_dim)}};
      execute(graph, in, out);
      std::copy(state_out_.begin(), state_out_.end(), state.data());
      return;
    }
    default:
      fail("hexagon", std::string("no state for op ") + op_name(n.op));
  }
}

void HexagonBackend::run_attention(const Node& n, const NodeArgs& args) {
  // The new key and value rows join the host's cache (the graphs that made them output only
  // them), as the CPU's attention appends them: a pass the CPU redoes writes them again.
  LayerState& cache = args.inputs->layers[n.layer];
  const int64_t width = cache.kv_row_floats, used = args.inputs->first_pos + 1;
  const int64_t length = cache_bucket(used);
  for (const auto& [state, row] :
       {std::pair{&cache.keys, args.at(n.in[1])}, std::pair{&cache.values, args.at(n.in[2])}}) {
    state->reserve(length * width);  // what the graph reads: past the rows in use, finite
    state->resize(used * width);
    std::copy_n(row, width, state->data() + (used - 1) * width);
  }
  Graph& graph = state_graph(n, length);
  const AttentionShape& a = n.attention;
  mask_.assign(static_cast<size_t>(a.n_heads * length), kMasked);
  for (int64_t h = 0; h < a.n_heads; ++h) std::fill_n(mask_.data() + h * length, used, 0.0f);
  const size_t q = static_cast<size_t>(a.n_heads * a.head_dim);
  const size_t cached = static_cast<size_t>(length * width);
  const std::span<const float> in[] = {
      {args.at(n.in[0]), q}, {cache.keys.data(), cached}, {cache.values.data(), cached}, mask_};
  const std::span<float> out[] = {{args.at(n.out), q}};
  execute(graph, in, out);
}

HexagonBackend::Graph& HexagonBackend::state_graph(const Node& n, int64_t length) {
  const AttentionShape& a = n.attention;
  const DeltaRuleShape& h = n.heads;
  std::string key = op_name(n.op);
  if (options_.perturb_op == key) key += " perturbed";
  switch (n.op) {
    case Op::kAttention:
      key += " h" + std::to_string(a.n_heads) + "/" + std::to_string(a.n_kv_heads) + "x" +
             std::to_string(a.head_dim) + " s" + std::to_string(std::bit_cast<uint32_t>(n.scale)) +
             " L" + std::to_string(length);
      break;
    case Op::kConvSilu:  // its weights are the graph's
      key += " c" + std::to_string(length) + " k" + std::to_string(n.width) + " v" +
             weight_name(*n.vector);
      break;
    default:
      key += " h" + std::to_string(h.n_k_heads) + "/" + std::to_string(h.n_v_heads) + " " +
             std::to_string(h.k_dim) + "x" + std::to_string(h.v_dim);
  }
  if (failed_keys_.contains(key)) cannot("this graph did not compile before");
  std::shared_ptr<Graph>& graph = graphs_[key];
  if (graph != nullptr) return *graph;
  try {
    Context& context = context_for({}, 0);
    graph = std::make_shared<Graph>(Graph{
        QnnGraph(*context.handle, "qhx_graph_" + std::to_string(graph_names_++)), {}, {}, {}});
    context.keys.push_back(key);
    QnnGraph& g = graph->graph;
    if (n.op == Op::kConvSilu) {
      build_conv(g, n, length);
    } else if (n.op == Op::kDeltaRule) {
      build_delta_rule(g, n);
    } else {
      build_attention(g, n, length);
    }
    g.finalize();
    ++graphs_compiled_;
  } catch (const std::exception& e) {
    compile_failed(key, e);
  }
  return *graph;
}

// The graph's next output: `result` reshaped to `dims`, and bumped by 0.25 when the test switch
// perturbs the node's op.
void HexagonBackend::emit(QnnGraph& g, const Node& n, QnnGraph::TensorId result,
                          std::vector<uint32_t> dims) const {
  const auto out = g.output(dims);
  if (options_.perturb_op != op_name(n.op)) {
    g.add("Reshape", {result}, {out});
    return;
  }
  const auto shaped = g.intermediate(std::move(dims));
  g.add("Reshape", {result}, {shaped});
  add_perturbation(g, shaped, out);
}

void HexagonBackend::build_attention(QnnGraph& g, const Node& n, int64_t length) const {
  const AttentionShape& a = n.attention;
  const uint32_t kv = dim(a.n_kv_heads), group = dim(a.n_heads / a.n_kv_heads),
                 hd = dim(a.head_dim), len = dim(length), width = dim(a.n_heads * a.head_dim);
  const auto q = g.input({1, width});
  const auto keys = g.input({len, dim(a.n_kv_heads * a.head_dim)});
  const auto values = g.input({len, dim(a.n_kv_heads * a.head_dim)});
  const auto mask = g.input({kv, group, len});
  // Query heads h = kv · group + j read kv head kv (GQA): [kv, group, hd] · [kv, len, hd]ᵀ.
  const auto qh = g.intermediate({kv, group, hd});
  g.add("Reshape", {q}, {qh});
  const auto by_head = [&](QnnGraph::TensorId rows) {
    const auto split = g.intermediate({len, kv, hd});
    g.add("Reshape", {rows}, {split});
    const uint32_t order[] = {1, 0, 2};
    const auto heads = g.intermediate({kv, len, hd});
    g.add("Transpose", {split}, {heads}, {}, {{"perm", g.constant_u32({3}, order)}});
    return heads;
  };
  const auto k = by_head(keys), v = by_head(values);
  const std::vector<uint32_t> scores_dims = {kv, group, len};
  const auto scores = g.intermediate(scores_dims);
  g.add("MatMul", {qh, k}, {scores},
        {{"transpose_in0", QnnGraph::boolean(false)}, {"transpose_in1", QnnGraph::boolean(true)}});
  const float scale[] = {n.scale};
  const auto scaled = g.intermediate(scores_dims);
  g.add("ElementWiseMultiply", {scores, g.constant({1}, scale)}, {scaled});
  const auto masked = g.intermediate(scores_dims);
  g.add("ElementWiseAdd", {scaled, mask}, {masked});
  const auto probs = g.intermediate(scores_dims);
  g.add("Softmax", {masked}, {probs}, {{"axis", QnnGraph::u32(2)}, {"beta", QnnGraph::f32(1)}});
  const auto heads_out = g.intermediate({kv, group, hd});
  g.add("MatMul", {probs, v}, {heads_out});
  emit(g, n, heads_out, {1, width});
}

void HexagonBackend::build_conv(QnnGraph& g, const Node& n, int64_t channels) const {
  // out = silu(Σ_j w[c, j] · window[j, c]) over the window [state; x] of kernel rows.
  const uint32_t c = dim(channels), kernel = dim(n.width);
  const auto x = g.input({1, c});
  const auto state = g.input({kernel - 1, c});
  const auto window = g.intermediate({kernel, c});
  g.add("Concat", {state, x}, {window}, {{"axis", QnnGraph::u32(0)}});
  std::vector<float> taps(static_cast<size_t>(kernel) * c);  // [kernel, channels]
  for (uint32_t ch = 0; ch < c; ++ch) {
    for (uint32_t j = 0; j < kernel; ++j) taps[j * c + ch] = (*n.vector)[ch * kernel + j];
  }
  const auto weighted = g.intermediate({kernel, c});
  g.add("ElementWiseMultiply", {window, g.constant({kernel, c}, taps)}, {weighted});
  const uint32_t axis_values[] = {0};
  const auto sum = g.intermediate({1, c});
  g.add("ReduceSum", {weighted}, {sum}, {{"keep_dims", QnnGraph::boolean(true)}},
        {{"axes", g.constant_u32({1}, axis_values)}});
  const auto sigmoid = g.intermediate({1, c}), silu = g.intermediate({1, c});
  g.add("Sigmoid", {sum}, {sigmoid});
  g.add("ElementWiseMultiply", {sum, sigmoid}, {silu});
  emit(g, n, silu, {1, c});
}

void HexagonBackend::build_delta_rule(QnnGraph& g, const Node& n) const {
  // One token of the gated delta rule per value head j (key head j / (Hv / Hk)):
  //   S ← exp(g) · S;  S ← S + k ⊗ β · (v − kᵀS);  o = qᵀS.
  const DeltaRuleShape& h = n.heads;
  const uint32_t hk = dim(h.n_k_heads), hv = dim(h.n_v_heads), dk = dim(h.k_dim), dv = dim(h.v_dim);
  const auto q = g.input({1, hk * dk}), k = g.input({1, hk * dk}), v = g.input({1, hv * dv});
  const auto beta = g.input({1, hv}), decay_log = g.input({1, hv});
  const auto state = g.input({hv, dk, dv});
  // Key heads to value heads: a 0/1 matrix (exact in fp16).
  std::vector<float> expand(static_cast<size_t>(hv) * hk, 0.0f);
  for (uint32_t j = 0; j < hv; ++j) expand[j * hk + j / (hv / hk)] = 1.0f;
  const auto expander = g.constant({hv, hk}, expand);
  const auto per_value_head = [&](QnnGraph::TensorId keys) {
    const auto heads = g.intermediate({hk, dk});
    g.add("Reshape", {keys}, {heads});
    const auto expanded = g.intermediate({hv, dk});
    g.add("MatMul", {expander, heads}, {expanded});
    return expanded;
  };
  const auto qv = per_value_head(q), kv = per_value_head(k);
  const auto column = [&](QnnGraph::TensorId x, std::vector<uint32_t> dims) {
    const auto shaped = g.intermediate(std::move(dims));
    g.add("Reshape", {x}, {shaped});
    return shaped;
  };
  const auto decay = g.intermediate({1, hv});
  g.add("ElementWiseExp", {decay_log}, {decay});
  const auto decayed = g.intermediate({hv, dk, dv});
  g.add("ElementWiseMultiply", {state, column(decay, {hv, 1, 1})}, {decayed});
  const auto remembered = g.intermediate({hv, 1, dv});
  g.add("MatMul", {column(kv, {hv, 1, dk}), decayed}, {remembered});
  const auto missing = g.intermediate({hv, 1, dv});
  g.add("ElementWiseSubtract", {column(v, {hv, 1, dv}), remembered}, {missing});
  const auto delta = g.intermediate({hv, 1, dv});
  g.add("ElementWiseMultiply", {missing, column(beta, {hv, 1, 1})}, {delta});
  const auto outer = g.intermediate({hv, dk, dv});
  g.add("MatMul", {column(kv, {hv, dk, 1}), delta}, {outer});
  const auto updated = g.intermediate({hv, dk, dv});
  g.add("ElementWiseAdd", {decayed, outer}, {updated});
  const auto state_out = g.output({hv, dk, dv});  // outputs: the state, then o
  g.add("Reshape", {updated}, {state_out});
  const auto read = g.intermediate({hv, 1, dv});
  g.add("MatMul", {column(qv, {hv, 1, dk}), updated}, {read});
  emit(g, n, read, {1, hv * dv});
}

}  // namespace qhx
