// The Hexagon NPU as a backend (graph/backend.h), through QNN (backend/qnn/qnn_device.h): it
// takes the row-wise work of prompt chunks — the projections (matmuls), the MLP, the norms and
// residual adds — in chunks of kChunkRows rows, and leaves to the CPU what carries state from
// token to token (attention over the KV cache, the Gated DeltaNet conv and delta rule, RoPE and
// the head splits) and every decode step. Each run of adjacent nodes it takes is one QNN graph of
// kChunkRows rows (compile), executed once per chunk of the run's rows; graph boundaries thus
// fall at the CPU's cores, as the TokForge card splits a Qwen3.5 layer.
//
// Graphs are compiled for the device's chip when a schedule is made (the simulator prepares them
// on the host; on a phone the HTP library prepares them on the device), and kept by what they
// compute (the ops, the shapes, which weights): the same run in another schedule reuses its
// graph. Weights become the graphs' constants, computed in fp16 (the HTP's float form).
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "backend/qnn/qnn_device.h"
#include "core/buffer.h"
#include "graph/backend.h"

namespace qhx {

struct HexagonBackendOptions {
  // Test switches (docs/hexagon.md; QHX_HEXAGON_FAIL_EXECUTION and QHX_HEXAGON_PERTURB set them
  // from the environment): the N-th graph execution fails as a lost device would (0: none), and
  // the output of every node of one op kind (op_name, e.g. "silu_mul") is perturbed ("": none).
  int64_t fail_execution = 0;
  std::string perturb_op;
};

class HexagonBackend final : public Backend {
 public:
  static constexpr int64_t kChunkRows = 128;  // the rows of every graph (the NPU's static shape)

  explicit HexagonBackend(std::shared_ptr<HexagonDevice> device,
                          HexagonBackendOptions options = {});
  ~HexagonBackend() override;

  std::string name() const override;
  const BufferType& buffer_type() const override { return memory_; }
  void prepare_weights(std::span<MatrixRef* const> matrices) override;
  void release_weights(std::span<MatrixRef* const> matrices) override;
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
  int64_t graphs_executed() const { return executions_; }   // one per chunk of a run
  int64_t chunks_run() const { return chunks_; }            // distinct prompt chunks of 128 rows

 private:
  std::shared_ptr<HexagonDevice> device_;
  HexagonBackendOptions options_;
  HostBufferType memory_;  // a type of its own: the arena is host memory QNN binds by address
  std::unique_ptr<Buffer> arena_;
  std::unique_ptr<HexagonContext> context_;
  std::map<const void*, int64_t> weight_ids_;  // a matrix's place in prepare_weights' list
  std::map<std::string, std::shared_ptr<Graph>> graphs_;  // by what they compute
  int64_t graphs_compiled_ = 0, executions_ = 0, chunks_ = 0;
  int64_t graph_names_ = 0;  // a context's graphs need names of their own, failed ones too
};

}  // namespace qhx
