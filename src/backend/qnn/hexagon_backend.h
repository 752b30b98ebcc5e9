// The Hexagon NPU as a backend (graph/backend.h), through QNN (backend/qnn/qnn_device.h): it
// takes the row-wise work of prompt chunks — the projections (matmuls), the MLP, the norms and
// residual adds — in chunks of kChunkRows rows, and leaves to the CPU what carries state from
// token to token (attention over the KV cache, the Gated DeltaNet conv and delta rule, RoPE and
// the head splits) and, unless it decodes, every decode step. Each run of adjacent nodes it takes
// is one QNN graph of kChunkRows rows (compile), executed once per chunk of the run's rows; graph
// boundaries thus fall at the CPU's cores, as the TokForge card splits a Qwen3.5 layer.
//
// Decoding (options.decode), a step's nodes run in graphs of one row: everything but the
// embedding, which the host looks up. The ops that carry state run in graphs of their own, the
// state in the host's memory as graph input: attention reads the KV cache (only the new rows
// leave the graphs that make them; the host appends them) in graphs per cache length, powers of
// two from kChunkRows, masked to the rows in use — a step costs what its bucket holds, at most
// twice the cache, and these graphs hold no weights, so they cost no memory per length; the
// conv reads its state and the new row (the host shifts the row in), the delta rule reads and
// writes its recurrent state. The lm-head is a graph of its own.
//
// Graphs are compiled for the device's chip when a schedule is made (the simulator prepares them
// on the host; on a phone the HTP library prepares them on the device), and kept by what they
// compute (the ops, the shapes, which weights): the same run in another schedule reuses its
// graph. Weights become the graphs' constants, in the options' form (npu_weights.h).
#pragma once

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "backend/qnn/npu_pack.h"
#include "backend/qnn/npu_weights.h"
#include "backend/qnn/qnn_device.h"
#include "core/buffer.h"
#include "graph/backend.h"

namespace qhx {

// The most bytes of constants (weights, in fp16) one context holds before the next graph starts
// another: an NPU process domain maps about 3.5 GB in all, a 3.6 GB context failed to load on a
// v81 phone (error 1002), and Qualcomm's own LLM exports split into parts of 1-2 GB.
inline constexpr int64_t kDefaultContextBudget = int64_t{1536} << 20;

struct HexagonBackendOptions {
  // Test switches (docs/hexagon.md; QHX_HEXAGON_FAIL_EXECUTION and QHX_HEXAGON_PERTURB set them
  // from the environment): the N-th graph execution fails as a lost device would (0: none), and
  // the output of every node of one op kind (op_name, e.g. "silu_mul") is perturbed ("": none).
  int64_t fail_execution = 0;
  std::string perturb_op;
  // Graphs are compiled and never run, their outputs left as they were (forge npu --no-check,
  // which runs nothing on the NPU: the layout of a model too large for the simulator to run).
  bool compile_only = false;
  int64_t context_budget_bytes = kDefaultContextBudget;
  // The constants' bytes of graphs by key, as a binary reported them (forge npu's second pass):
  // used instead of the estimate when grouping graphs into contexts.
  std::map<std::string, int64_t> known_constant_bytes;
  // How the matmuls compute (npu_weights.h), and the calibrated ranges of their inputs and
  // outputs that the 16-bit forms need: a matmul without ranges computes in fp16.
  NpuForm form = NpuForm::kF16;
  ActivationRanges ranges;
  // Single-token steps run here too (--decode-device hexagon): every node but the embedding, in
  // graphs of one row, the states from the host's memory, the lm-head as a graph of its own;
  // compiled here, they share their weights with the prompt graphs (HexagonContext).
  bool decode = false;
  // The pack its graphs came from (the start of its MANIFEST.json's sha256), in its name: the
  // check before use is remembered per chip, QNN build and pack.
  std::string pack_id;
};

// out = x · Wᵀ over `rows` rows in a 16-bit form (npu_weights.h): x (float) quantized over
// ranges.in, the weights as the form stores them, the product encoded over ranges.out and
// dequantized into out (float).
void add_quantized_matmul(QnnGraph& g, QnnGraph::TensorId x, QnnGraph::TensorId out,
                          const MatrixRef& w, NpuForm form, const MatmulRanges& ranges,
                          uint32_t rows);

class HexagonBackend final : public Backend {
 public:
  static constexpr int64_t kChunkRows = 128;  // the rows of every graph (the NPU's static shape)

  explicit HexagonBackend(std::shared_ptr<HexagonDevice> device,
                          HexagonBackendOptions options = {});
  // Its graphs loaded from a pack's contexts for the device's chip (npu_pack.h: checked against
  // the manifest by the caller); a run the pack lacks is compiled as without one.
  HexagonBackend(std::shared_ptr<HexagonDevice> device, HexagonBackendOptions options,
                 std::vector<NpuPackContext> pack);
  ~HexagonBackend() override;

  std::string name() const override;
  const BufferType& buffer_type() const override { return memory_; }
  void release_weights(const WeightList& weights) override;
  DType computes_weights_as() const override;
  // Notes about what its graphs' constants will take: every matrix but the lm-head (unless it
  // decodes), in the form's precision.
  void prepare_weights(const WeightList& weights) override;
  // Its graphs' constants (copies of the weights, in the form's precision): the binaries loaded
  // from a pack, about what the graphs compiled here hold, at least what prepare_weights
  // expects (graphs compiled on first use are counted before they are). In the host's RAM on
  // a phone: what memory admission counts.
  WeightMemory weight_memory() const override;
  // Decoding, its attention appends to the host's KV caches.
  bool computes_states() const override { return options_.decode; }
  bool supports(const Node& node) const override;
  bool claims(const Node& node) const override;
  int64_t rows_multiple() const override { return kChunkRows; }
  void fuse(const Plan& plan, std::span<Node> nodes) const override;
  std::shared_ptr<const CompiledRun> compile(const Plan& plan,
                                             std::span<const Node> nodes) override;
  Buffer& arena(size_t bytes) override;
  void run(const Plan& plan, std::span<const Node> nodes, const NodeArgs& args) override;

  const HexagonDevice& device() const { return *device_; }
  struct Graph;  // a compiled graph (hexagon_backend.cc)
  int64_t graphs_compiled() const { return graphs_compiled_; }
  int64_t graphs_executed() const { return executions_; }  // one per chunk of a run
  int64_t chunks_run() const { return chunks_; }           // distinct prompt chunks of 128 rows
  int64_t decode_steps() const { return steps_; }          // single-token passes it ran
  int64_t graphs_from_pack() const { return graphs_from_pack_; }
  int64_t contexts() const { return static_cast<int64_t>(contexts_.size()); }
  // Why each run that did not compile did not (its runs went to the CPU).
  const std::vector<std::string>& compile_failures() const { return compile_failures_; }
  // The contexts it compiled graphs into, serialized, each with its graphs as the binary
  // describes them (what qhx forge npu writes into a pack, unless they share weights).
  std::vector<NpuPackContext> export_contexts() const;
  // Decoding: compiles the attention graphs of every cache length up to `context` rows for the
  // attention shapes its schedules have met (forge npu --decode, so that a pack holds every graph
  // a decode step needs). Error kDeviceFailed when one does not compile.
  void compile_attention_lengths(int64_t context);

 private:
  std::shared_ptr<HexagonDevice> device_;
  HexagonBackendOptions options_;
  HostBufferType memory_;  // a type of its own: the arena is host memory QNN binds by address
  std::unique_ptr<Buffer> arena_;
  struct Context {
    std::unique_ptr<HexagonContext> handle;
    bool from_pack = false;         // finalized in its binary: no graph is added to it
    bool retired = false;           // a graph failed in it: no graph is added to it
    int64_t const_estimate = 0;     // compiled here: its graphs' constants, about
    int64_t binary_bytes = 0;       // from a pack: its binary's size
    std::vector<std::string> keys;  // its graphs
    std::set<std::string> weights;  // its graphs' weights (by name), held once when it shares
    bool shares = false;            // made with weight sharing
  };
  bool sharing_refused_ = false;  // the HTP would not make a context that shares weights
  // A graph's weights by name, each with about what its constant takes.
  using GraphWeights = std::vector<std::pair<std::string, int64_t>>;
  // Whether its contexts share weights: decoding, a step's graphs hold the weights the prompt
  // graphs of the same layers hold, unless those came from a pack (its binaries cannot be
  // given more graphs).
  bool shares_weights() const;
  // The context a new graph goes into, within the budget: decoding, the one that already holds
  // the most of its weights (they cost nothing again there), else the latest. `bytes`: what its
  // constants take when none is shared.
  Context& context_for(const GraphWeights& weights, int64_t bytes);
  std::vector<std::unique_ptr<Context>> contexts_;
  // A decode step's node that carries state (attention over the KV cache, the conv, the delta
  // rule), its state read from (and written back to) the host's memory.
  void run_with_state(const Node& node, const NodeArgs& args);
  void run_attention(const Node& node, const NodeArgs& args);
  // Its graph: attention's for a cache of `length` rows, the conv's of `length` channels.
  Graph& state_graph(const Node& node, int64_t length);
  void build_attention(QnnGraph& g, const Node& node, int64_t length) const;
  void build_conv(QnnGraph& g, const Node& node, int64_t channels) const;
  void build_delta_rule(QnnGraph& g, const Node& node) const;
  void emit(QnnGraph& g, const Node& node, QnnGraph::TensorId result,
            std::vector<uint32_t> dims) const;
  std::vector<Node> attention_nodes_;  // one per attention shape compiled (no weights)
  std::vector<float> mask_;            // an attention graph's mask, as it last ran
  std::vector<float> state_out_;       // a delta rule graph's new state, before it is written back
  // Notes a graph that did not compile (its run goes to the CPU) and throws kDeviceFailed.
  [[noreturn]] void compile_failed(const std::string& key, const std::exception& e);
  // Runs a graph (counted; the fault-injection switch; not with compile_only).
  void execute(Graph& graph, std::span<const std::span<const float>> in,
               std::span<const std::span<float>> out);
  // The calibrated ranges of a matmul computing in a 16-bit form, or null (fp16).
  const MatmulRanges* quantized(const MatrixRef& w) const;
  std::map<std::string, std::shared_ptr<Graph>> graphs_;  // by what they compute
  std::set<std::string> failed_keys_;                     // runs that did not compile
  std::vector<std::string> compile_failures_;
  int64_t expected_constant_bytes_ = 0;  // prepare_weights' estimate
  bool holds_model_ = false;             // prepared and not yet released
  int64_t graphs_compiled_ = 0, executions_ = 0, chunks_ = 0, steps_ = 0;
  int64_t graph_names_ = 0;  // a context's graphs need names of their own, failed ones too
  int64_t graphs_from_pack_ = 0;
};

}  // namespace qhx
