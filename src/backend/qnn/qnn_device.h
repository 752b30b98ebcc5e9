// The HTP as qhx drives it through QNN: a device opened for one chip, contexts (a context holds
// compiled graphs and their weights, and serializes to a context binary, the unit a pack ships
// per chip), and graphs built op by op, finalized (compiled for the chip) and executed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/qnn/qnn_library.h"

namespace qhx {

class HexagonDevice {
 public:
  // The backend and device for `chip` (Error kDeviceFailed when QNN refuses them).
  static std::shared_ptr<HexagonDevice> open(std::shared_ptr<const QnnLibrary> library,
                                             const HexagonChip& chip);
  ~HexagonDevice();
  HexagonDevice(const HexagonDevice&) = delete;
  HexagonDevice& operator=(const HexagonDevice&) = delete;

  const QnnLibrary& library() const { return *library_; }
  const HexagonChip& chip() const { return chip_; }
  qnn::Handle backend() const { return backend_; }
  qnn::Handle device() const { return device_; }
  // "hexagon:v81 · SM8850 (...) · simulator · QNN 2.40.0, HTP 5.51.0, build ..."
  std::string describe() const;

 private:
  HexagonDevice(std::shared_ptr<const QnnLibrary> library, const HexagonChip& chip)
      : library_(std::move(library)), chip_(chip) {}
  std::shared_ptr<const QnnLibrary> library_;
  HexagonChip chip_;
  qnn::Handle log_ = nullptr, backend_ = nullptr, device_ = nullptr;
};

class QnnGraph;

// A context: graphs are created in it and finalized, or it is made from a context binary whose
// graphs are then retrieved by name.
class HexagonContext {
 public:
  // weight_sharing: its graphs hold each constant of the same bytes once (HTP's
  // WEIGHT_SHARING_ENABLED: a prompt chunk's graph and a decode step's share their weights). The
  // simulator cannot load such a context's binary again (QNN error 1000, "Shared weights buffer
  // isn't supported on this platform"): packs are made without.
  explicit HexagonContext(std::shared_ptr<HexagonDevice> device, bool weight_sharing = false);
  HexagonContext(std::shared_ptr<HexagonDevice> device, std::span<const unsigned char> binary);
  ~HexagonContext();
  HexagonContext(const HexagonContext&) = delete;
  HexagonContext& operator=(const HexagonContext&) = delete;

  HexagonDevice& device() const { return *device_; }
  qnn::Handle handle() const { return context_; }
  // The context binary of its finalized graphs.
  std::vector<unsigned char> binary() const;

 private:
  std::shared_ptr<HexagonDevice> device_;
  qnn::Handle context_ = nullptr;
};

// One graph. Built: tensors and ops added, then finalize. Retrieved from a binary: its inputs and
// outputs described again (same order, dimensions and types) so that execute can name them.
class QnnGraph {
 public:
  using TensorId = size_t;  // an index into this graph's tensors
  // A graph to build in `context`, under `name`.
  QnnGraph(HexagonContext& context, std::string name);
  // A finalized graph of `context` (made from a binary), as the binary describes it.
  static QnnGraph retrieve(HexagonContext& context, const HexagonBinaryInfo::Graph& graph);

  // Tensors: f32 unless said. Inputs and outputs are bound at execute, in the order made.
  TensorId input(std::vector<uint32_t> dims);
  TensorId output(std::vector<uint32_t> dims);
  TensorId intermediate(std::vector<uint32_t> dims);
  // A constant (weights): its values are copied into the graph.
  TensorId constant(std::vector<uint32_t> dims, std::span<const float> values);
  TensorId constant_u32(std::vector<uint32_t> dims, std::span<const uint32_t> values);
  TensorId constant_i32(std::vector<uint32_t> dims, std::span<const int32_t> values);
  // Fixed-point tensors: real = (q + offset) · scale, with one (scale, offset) for the whole
  // tensor (activations) or one per index of `axis` (a weight's rows); 4-bit blocks in QNN's
  // blockwise expansion: index i of `axis` has values[i] times a 4-bit integer per block,
  // block_scales[i · blocks + b] (the integers one per byte, in an sfixed8 tensor).
  struct Encoding {
    qnn::DataType type = qnn::kUfixed16;
    std::vector<qnn::ScaleOffset> values;
    int32_t axis = -1;  // -1: per tensor
    std::vector<uint8_t> block_scales;
    qnn::BlockwiseExpansion expansion{};  // what QNN is given (set by the graph)

    static Encoding per_tensor(qnn::DataType type, qnn::ScaleOffset value);
    static Encoding per_row(qnn::DataType type, std::span<const float> scales);  // offsets 0
    // sfixed8, offsets 0: the channels of dimension `axis` (a Conv2d's output channels, 3),
    // each in blocks along the input channels.
    static Encoding per_channel_in_blocks(int32_t axis, std::span<const float> channel_scales,
                                          std::vector<uint8_t> block_scales);
  };
  TensorId intermediate(std::vector<uint32_t> dims, const Encoding& encoding);
  TensorId constant(std::vector<uint32_t> dims, std::span<const std::byte> data,
                    const Encoding& encoding);
  struct ScalarParam {
    const char* name;
    qnn::Scalar value;
  };
  struct TensorParam {
    const char* name;
    TensorId tensor;
  };
  static qnn::Scalar f32(float v);
  static qnn::Scalar u32(uint32_t v);
  static qnn::Scalar boolean(bool v);
  void add(const char* type, std::vector<TensorId> inputs, std::vector<TensorId> outputs,
           std::vector<ScalarParam> scalars = {}, std::vector<TensorParam> tensors = {});
  void finalize();

  // Runs it: `inputs` and `outputs` in the order input()/output() made them, each holding its
  // tensor's f32 elements exactly (QNN does not check sizes: this does).
  void execute(std::span<const std::span<const float>> inputs,
               std::span<const std::span<float>> outputs);

  const std::string& name() const { return name_; }
  // The dimensions of its i-th input and output, in the order execute binds them.
  const std::vector<uint32_t>& input_dims(size_t i) const { return slots_.at(inputs_.at(i)).dims; }
  const std::vector<uint32_t>& output_dims(size_t i) const {
    return slots_.at(outputs_.at(i)).dims;
  }
  size_t ops() const { return ops_; }

 private:
  struct Slot {
    qnn::Tensor tensor;
    std::vector<uint32_t> dims;
    std::string name;
    std::vector<unsigned char> data;  // a constant's, until finalize
    Encoding encoding;                // a fixed-point tensor's (QNN points into it)
    int64_t elements() const;
  };
  explicit QnnGraph(HexagonContext& context) : context_(&context) {}
  TensorId make(qnn::TensorType type, std::vector<uint32_t> dims, qnn::DataType data_type,
                std::span<const unsigned char> data, const Encoding* encoding = nullptr);

  HexagonContext* context_;
  std::string name_;
  qnn::Handle graph_ = nullptr;
  std::deque<Slot> slots_;  // stable addresses: QNN keeps pointers into them until finalize
  std::vector<TensorId> inputs_, outputs_;
  size_t ops_ = 0;
  bool finalized_ = false;
};

}  // namespace qhx
