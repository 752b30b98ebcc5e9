#include "backend/qnn/qnn_device.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "util/error.h"

namespace qhx {
namespace {

// QNN's messages go to stderr when QHX_QNN_LOG names a level (1 errors ... 4 verbose), else
// nowhere: without a log of its own the library prints its errors on stdout. (QNN's callback
// has no user pointer, so it cannot be routed per device.)
uint32_t log_level() {
  const char* level = std::getenv("QHX_QNN_LOG");
  return level != nullptr ? static_cast<uint32_t>(std::atoi(level)) : 0;
}

void log_to_stderr(const char* format, uint32_t level, uint64_t, va_list args) {
  if (level > log_level()) return;
  std::fputs("qnn: ", stderr);
  std::vfprintf(stderr, format, args);
  std::fputc('\n', stderr);
}

}  // namespace

std::shared_ptr<HexagonDevice> HexagonDevice::open(std::shared_ptr<const QnnLibrary> library,
                                                   const HexagonChip& chip) {
  std::shared_ptr<HexagonDevice> d(new HexagonDevice(std::move(library), chip));
  const QnnLibrary& lib = *d->library_;
  const uint32_t level = log_level();
  lib.check("QNN log",
            lib.api().log_create(log_to_stderr, level > 0 ? level : qnn::kLogError, &d->log_));
  lib.check("QNN HTP backend", lib.api().backend_create(d->log_, nullptr, &d->backend_));
  qnn::HtpDeviceConfig soc;
  soc.option = qnn::kHtpSoc;
  soc.soc_model = chip.soc;
  // The SoC decides the arch (an arch given beside it is ignored, and deprecated).
  qnn::Config soc_config;
  soc_config.custom = &soc;
  const qnn::Config* configs[] = {&soc_config, nullptr};
  lib.check("QNN HTP device v" + std::to_string(chip.arch),
            lib.api().device_create(d->log_, configs, &d->device_));
  return d;
}

HexagonDevice::~HexagonDevice() {
  const qnn::FunctionTable& api = library_->api();
  if (device_ != nullptr) api.device_free(device_);
  if (backend_ != nullptr) api.backend_free(backend_);
  if (log_ != nullptr) api.log_free(log_);
}

std::string HexagonDevice::describe() const {
  return "hexagon:v" + std::to_string(chip_.arch) + " · " + chip_.name + " · " +
         (library_->simulator() ? "Qualcomm's HTP simulator" : "NPU") + " · " +
         library_->describe();
}

HexagonContext::HexagonContext(std::shared_ptr<HexagonDevice> device, bool weight_sharing)
    : device_(std::move(device)) {
  const QnnLibrary& lib = device_->library();
  qnn::HtpContextConfig sharing;
  sharing.option = qnn::kHtpWeightSharing;
  sharing.b8 = 1;
  qnn::Config sharing_config;
  sharing_config.custom = &sharing;
  const qnn::Config* configs[] = {&sharing_config, nullptr};
  lib.check("QNN context", lib.api().context_create(device_->backend(), device_->device(),
                                                    weight_sharing ? configs : nullptr, &context_));
}

HexagonContext::HexagonContext(std::shared_ptr<HexagonDevice> device,
                               std::span<const unsigned char> binary)
    : device_(std::move(device)) {
  const QnnLibrary& lib = device_->library();
  lib.check("QNN context from a binary",
            lib.api().context_create_from_binary(device_->backend(), device_->device(), nullptr,
                                                 binary.data(), binary.size(), &context_, nullptr));
}

HexagonContext::~HexagonContext() {
  if (context_ != nullptr) device_->library().api().context_free(context_, nullptr);
}

std::vector<unsigned char> HexagonContext::binary() const {
  const QnnLibrary& lib = device_->library();
  uint64_t bound = 0;
  lib.check("QNN context binary size", lib.api().context_get_binary_size(context_, &bound));
  std::vector<unsigned char> out(bound);
  uint64_t written = 0;
  lib.check("QNN context binary",
            lib.api().context_get_binary(context_, out.data(), out.size(), &written));
  out.resize(written);
  return out;
}

int64_t QnnGraph::Slot::elements() const {
  int64_t n = 1;
  for (const uint32_t d : dims) n *= d;
  return n;
}

QnnGraph::QnnGraph(HexagonContext& context, std::string name)
    : context_(&context), name_(std::move(name)) {
  const QnnLibrary& lib = context.device().library();
  lib.check("QNN graph " + name_,
            lib.api().graph_create(context.handle(), name_.c_str(), nullptr, &graph_));
}

QnnGraph QnnGraph::retrieve(HexagonContext& context, const HexagonBinaryInfo::Graph& graph) {
  QnnGraph g(context);
  g.name_ = graph.name;
  const QnnLibrary& lib = context.device().library();
  lib.check("QNN graph " + g.name_,
            lib.api().graph_retrieve(context.handle(), g.name_.c_str(), &g.graph_));
  const auto describe = [&](const HexagonBinaryInfo::Tensor& t, qnn::TensorType type) {
    if (t.data_type != qnn::kFloat32) {
      fail("context binary: graph " + g.name_, "tensor " + t.name + " is not float32");
    }
    Slot& s = g.slots_.emplace_back();
    s.dims = t.dims;
    s.tensor.v1.id = t.id;
    s.tensor.v1.type = type;
    s.tensor.v1.rank = static_cast<uint32_t>(s.dims.size());
    return g.slots_.size() - 1;
  };
  for (const auto& t : graph.inputs) g.inputs_.push_back(describe(t, qnn::kAppWrite));
  for (const auto& t : graph.outputs) g.outputs_.push_back(describe(t, qnn::kAppRead));
  g.finalized_ = true;
  return g;
}

QnnGraph::TensorId QnnGraph::make(qnn::TensorType type, std::vector<uint32_t> dims,
                                  qnn::DataType data_type, std::span<const unsigned char> data,
                                  const Encoding* encoding) {
  if (finalized_) fail("QNN graph " + name_, "finalized: no tensor can be added");
  if (data.size() > UINT32_MAX) {  // QNN's client buffers count bytes in 32 bits
    throw Error("QNN graph " + name_ + ": a constant of " + std::to_string(data.size()) +
                    " bytes, over the 4 GiB a tensor holds",
                ErrorKind::kDeviceFailed);
  }
  Slot& s = slots_.emplace_back();
  s.dims = std::move(dims);
  s.name = 't';
  s.name += std::to_string(slots_.size() - 1);
  s.data.assign(data.begin(), data.end());
  qnn::TensorV1& t = s.tensor.v1;
  t.name = s.name.c_str();
  t.type = type;
  t.data_type = data_type;
  t.rank = static_cast<uint32_t>(s.dims.size());
  t.dimensions = s.dims.data();
  if (!s.data.empty()) t.client = {s.data.data(), static_cast<uint32_t>(s.data.size())};
  if (encoding != nullptr) {
    s.encoding = *encoding;
    t.data_type = s.encoding.type;
    qnn::QuantizeParams& q = t.quantize;
    q.definition = qnn::kDefined;
    if (!s.encoding.block_scales.empty()) {
      qnn::BlockwiseExpansion& e = s.encoding.expansion;
      e.axis = s.encoding.axis;
      e.channels = s.encoding.values.data();
      e.blocks_per_channel =
          static_cast<uint32_t>(s.encoding.block_scales.size() / s.encoding.values.size());
      e.block_scale_bits = 4;
      e.block_scale_storage = qnn::kBlockScale8;
      e.block_scales = s.encoding.block_scales.data();
      q.encoding = qnn::kBlockwiseExpansion;
      q.blockwise_expansion = &e;
    } else if (s.encoding.axis >= 0) {
      q.encoding = qnn::kAxisScaleOffset;
      q.axis_scale_offset = {s.encoding.axis, static_cast<uint32_t>(s.encoding.values.size()),
                             s.encoding.values.data()};
    } else {
      if (s.encoding.values.size() != 1) {
        fail("QNN graph " + name_, "a per-tensor encoding of several values");
      }
      q.encoding = qnn::kScaleOffset;
      q.scale_offset = s.encoding.values[0];
    }
  }
  const QnnLibrary& lib = context_->device().library();
  lib.check("QNN tensor of graph " + name_,
            lib.api().tensor_create_graph_tensor(graph_, &s.tensor));
  return slots_.size() - 1;
}

QnnGraph::TensorId QnnGraph::input(std::vector<uint32_t> dims) {
  const TensorId id = make(qnn::kAppWrite, std::move(dims), qnn::kFloat32, {});
  inputs_.push_back(id);
  return id;
}

QnnGraph::TensorId QnnGraph::output(std::vector<uint32_t> dims) {
  const TensorId id = make(qnn::kAppRead, std::move(dims), qnn::kFloat32, {});
  outputs_.push_back(id);
  return id;
}

QnnGraph::TensorId QnnGraph::intermediate(std::vector<uint32_t> dims) {
  return make(qnn::kNative, std::move(dims), qnn::kFloat32, {});
}

QnnGraph::TensorId QnnGraph::constant(std::vector<uint32_t> dims, std::span<const float> values) {
  return make(qnn::kStatic, std::move(dims), qnn::kFloat32,
              {reinterpret_cast<const unsigned char*>(values.data()), values.size_bytes()});
}

QnnGraph::TensorId QnnGraph::constant_u32(std::vector<uint32_t> dims,
                                          std::span<const uint32_t> values) {
  return make(qnn::kStatic, std::move(dims), qnn::kUint32,
              {reinterpret_cast<const unsigned char*>(values.data()), values.size_bytes()});
}

QnnGraph::TensorId QnnGraph::constant_i32(std::vector<uint32_t> dims,
                                          std::span<const int32_t> values) {
  return make(qnn::kStatic, std::move(dims), qnn::kInt32,
              {reinterpret_cast<const unsigned char*>(values.data()), values.size_bytes()});
}

QnnGraph::Encoding QnnGraph::Encoding::per_tensor(qnn::DataType type, qnn::ScaleOffset value) {
  Encoding e;
  e.type = type;
  e.values = {value};
  return e;
}

QnnGraph::Encoding QnnGraph::Encoding::per_row(qnn::DataType type, std::span<const float> scales) {
  Encoding e;
  e.type = type;
  e.axis = 0;
  for (const float scale : scales) e.values.push_back({scale, 0});
  return e;
}

QnnGraph::Encoding QnnGraph::Encoding::per_channel_in_blocks(int32_t axis,
                                                             std::span<const float> channel_scales,
                                                             std::vector<uint8_t> block_scales) {
  Encoding e = per_row(qnn::kSfixed8, channel_scales);
  e.axis = axis;
  e.block_scales = std::move(block_scales);
  return e;
}

QnnGraph::TensorId QnnGraph::intermediate(std::vector<uint32_t> dims, const Encoding& encoding) {
  return make(qnn::kNative, std::move(dims), encoding.type, {}, &encoding);
}

QnnGraph::TensorId QnnGraph::constant(std::vector<uint32_t> dims, std::span<const std::byte> data,
                                      const Encoding& encoding) {
  return make(qnn::kStatic, std::move(dims), encoding.type,
              {reinterpret_cast<const unsigned char*>(data.data()), data.size()}, &encoding);
}

qnn::Scalar QnnGraph::f32(float v) {
  qnn::Scalar s{};
  s.data_type = qnn::kFloat32;
  s.f32 = v;
  return s;
}

qnn::Scalar QnnGraph::u32(uint32_t v) {
  qnn::Scalar s{};
  s.data_type = qnn::kUint32;
  s.u32 = v;
  return s;
}

qnn::Scalar QnnGraph::boolean(bool v) {
  qnn::Scalar s{};
  s.data_type = qnn::kBool8;
  s.b8 = v ? 1 : 0;
  return s;
}

void QnnGraph::add(const char* type, std::vector<TensorId> inputs, std::vector<TensorId> outputs,
                   std::vector<ScalarParam> scalars, std::vector<TensorParam> tensors) {
  std::vector<qnn::Tensor> in, out;
  for (const TensorId i : inputs) in.push_back(slots_.at(i).tensor);
  for (const TensorId o : outputs) out.push_back(slots_.at(o).tensor);
  std::vector<qnn::Param> params(scalars.size() + tensors.size());
  size_t p = 0;
  for (const ScalarParam& s : scalars) {
    params[p].type = qnn::kScalarParam;
    params[p].name = s.name;
    params[p++].scalar = s.value;
  }
  for (const TensorParam& t : tensors) {
    params[p].type = qnn::kTensorParam;
    params[p].name = t.name;
    params[p++].tensor = slots_.at(t.tensor).tensor;
  }
  const std::string op_name = name_ + "_op" + std::to_string(ops_);
  qnn::OpConfig op;
  op.name = op_name.c_str();
  op.type = type;
  op.n_params = static_cast<uint32_t>(params.size());
  op.params = params.data();
  op.n_inputs = static_cast<uint32_t>(in.size());
  op.inputs = in.data();
  op.n_outputs = static_cast<uint32_t>(out.size());
  op.outputs = out.data();
  const QnnLibrary& lib = context_->device().library();
  lib.check(std::string("QNN ") + type + " in graph " + name_,
            lib.api().graph_add_node(graph_, op));
  ++ops_;
}

void QnnGraph::finalize() {
  const QnnLibrary& lib = context_->device().library();
  lib.check("QNN graph " + name_ + " (compiling for v" +
                std::to_string(context_->device().chip().arch) + ")",
            lib.api().graph_finalize(graph_, nullptr, nullptr));
  finalized_ = true;
  for (Slot& s : slots_) s.data = {};  // constants live in the graph now
}

void QnnGraph::execute(std::span<const std::span<const float>> inputs,
                       std::span<const std::span<float>> outputs) {
  if (!finalized_) fail("QNN graph " + name_, "executed before it was finalized");
  if (inputs.size() != inputs_.size() || outputs.size() != outputs_.size()) {
    fail("QNN graph " + name_, "bound with the wrong number of inputs or outputs");
  }
  std::vector<qnn::Tensor> in, out;
  const auto bind = [&](TensorId id, const void* data, size_t count) {
    const Slot& s = slots_[id];
    if (static_cast<int64_t>(count) != s.elements()) {  // the device's fault: the CPU redoes it
      throw Error("QNN graph " + name_ + ": a tensor of " + std::to_string(s.elements()) +
                      " elements bound to " + std::to_string(count),
                  ErrorKind::kDeviceFailed);
    }
    qnn::Tensor t = s.tensor;
    t.v1.dimensions = const_cast<uint32_t*>(s.dims.data());
    t.v1.client = {const_cast<void*>(data), static_cast<uint32_t>(count * sizeof(float))};
    return t;
  };
  for (size_t i = 0; i < inputs.size(); ++i) {
    in.push_back(bind(inputs_[i], inputs[i].data(), inputs[i].size()));
  }
  for (size_t o = 0; o < outputs.size(); ++o) {
    out.push_back(bind(outputs_[o], outputs[o].data(), outputs[o].size()));
  }
  const QnnLibrary& lib = context_->device().library();
  lib.check("QNN graph " + name_ + " execution",
            lib.api().graph_execute(graph_, in.data(), static_cast<uint32_t>(in.size()), out.data(),
                                    static_cast<uint32_t>(out.size()), nullptr, nullptr));
}

}  // namespace qhx
