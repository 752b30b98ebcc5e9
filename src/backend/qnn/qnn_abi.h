// qhx's own declarations of the part of Qualcomm's QNN C ABI it calls (core API 2.32 and later,
// the HTP backend, QNN System). Qualcomm's SDK headers are proprietary and are not used: these
// are written from the facts of the public headers (field order and widths, enum values, the
// function table's order) gathered in docs/hexagon.md, and checked against the library by
// tests/hexagon_test.cc (the build id read through the table, graphs that build, run, serialize
// and load). LP64 only (x86_64 for the simulator, aarch64 on a phone): the asserts pin every size
// and offset.
//
// Where the library differs from the last public header (core 2.32 / HTP 5.43), the library
// wins: the HTP device custom config carries its value at byte 8, not 4 (2.51 rejects the other
// with error 14001).
#pragma once

#include <cstdarg>
#include <cstddef>
#include <cstdint>

namespace qhx::qnn {

static_assert(sizeof(void*) == 8, "the QNN declarations are LP64's");

// Every call returns an error handle; its code is the low 16 bits (0: success).
using ErrorHandle = uint64_t;
inline uint32_t error_code(ErrorHandle e) {
  return static_cast<uint32_t>(e & 0xFFFF);
}
inline constexpr uint32_t kMemAllocError = 1002;  // 0x3ea: a context that did not fit
using Handle = void*;                             // log, backend, device, context, graph, ...

struct Version {
  uint32_t major, minor, patch;
};
struct ApiVersion {
  Version core, backend;
};

enum DataType : uint32_t {
  kInt32 = 0x0032,
  kUint32 = 0x0132,
  kFloat16 = 0x0216,
  kFloat32 = 0x0232,
  kSfixed4 = 0x0304,  // two to a byte, the first in the low nibble (HTP 5.51 refuses it)
  kSfixed8 = 0x0308,
  kSfixed16 = 0x0316,
  kSfixed32 = 0x0332,
  kUfixed8 = 0x0408,
  kUfixed16 = 0x0416,
  kBool8 = 0x0508,
};
enum TensorType : uint32_t {
  kAppWrite = 0,
  kAppRead = 1,
  kAppReadWrite = 2,
  kNative = 3,
  kStatic = 4,
};
enum QuantizeDefinition : uint32_t { kDefined = 1, kUndefinedDefinition = 0x7FFFFFFF };
enum QuantizeEncoding : uint32_t {
  kScaleOffset = 0,      // one (scale, offset): real = (q + offset) · scale
  kAxisScaleOffset = 1,  // one per index of `axis`
  kBwScaleOffset = 2,    // one, with a bit width below the data type's
  kBwAxisScaleOffset = 3,
  kBlock = 4,  // one per block of a given shape (HTP 5.51 has no FullyConnected for it)
  kBlockwiseExpansion = 5,  // one per index of `axis`, times a small integer per block
  kUndefinedEncoding = 0x7FFFFFFF,
};
enum MemoryType : uint32_t { kRaw = 0 };
enum ParamType : uint32_t { kScalarParam = 0, kTensorParam = 1 };

struct ScaleOffset {
  float scale;
  int32_t offset;
};
struct AxisScaleOffset {
  int32_t axis;
  uint32_t count;
  ScaleOffset* values;
};
enum BlockScaleStorage : uint32_t { kBlockScale8 = 0, kBlockScale16 = 1 };
struct BlockwiseExpansion {
  int32_t axis;           // the channel dimension
  ScaleOffset* channels;  // one per channel
  uint32_t blocks_per_channel;
  uint32_t block_scale_bits;  // the integer block scales' width (4: 0..15)
  uint32_t block_scale_storage;
  uint8_t* block_scales;  // [channel][block]; kBlockScale8. scale = channel's · this
};
static_assert(offsetof(BlockwiseExpansion, channels) == 8 &&
              offsetof(BlockwiseExpansion, block_scales) == 32);
struct QuantizeParams {
  uint32_t definition = kUndefinedDefinition;  // a float tensor
  uint32_t encoding = kUndefinedEncoding;
  union {
    ScaleOffset scale_offset;
    AxisScaleOffset axis_scale_offset;
    BlockwiseExpansion* blockwise_expansion;
    unsigned char bytes[32] = {};  // the largest member (a bit-width per-axis form)
  };
};
static_assert(sizeof(QuantizeParams) == 40 && offsetof(QuantizeParams, scale_offset) == 8);

struct ClientBuffer {
  void* data;
  uint32_t bytes;  // a single buffer holds at most 4 GiB
};
struct TensorV1 {
  uint32_t id = 0;  // the library's, from tensorCreate*; execution matches on it
  const char* name = nullptr;
  uint32_t type = kNative;
  uint32_t data_format = 0;  // dense
  uint32_t data_type = kFloat32;
  QuantizeParams quantize{};
  uint32_t rank = 0;
  uint32_t* dimensions = nullptr;
  uint32_t memory_type = kRaw;
  ClientBuffer client{nullptr, 0};
};
struct Tensor {
  uint32_t version = 1;
  TensorV1 v1{};
  unsigned char v2_tail[24] = {};  // a version-2 tensor's further fields, unused (zero)
};
static_assert(offsetof(TensorV1, quantize) == 32 && offsetof(TensorV1, rank) == 72 &&
              offsetof(TensorV1, dimensions) == 80 && offsetof(TensorV1, client) == 96 &&
              sizeof(TensorV1) == 112);
static_assert(sizeof(Tensor) == 144 && offsetof(Tensor, v1) == 8);

struct Scalar {
  uint32_t data_type;
  union {
    float f32;
    uint32_t u32;
    int32_t i32;
    uint8_t b8;
    uint64_t bits = 0;
  };
};
static_assert(sizeof(Scalar) == 16);
struct Param {
  uint32_t type = kScalarParam;
  const char* name = nullptr;
  union {
    Scalar scalar;
    Tensor tensor;
  };
  Param() : tensor() {}
};
static_assert(sizeof(Param) == 160 && offsetof(Param, scalar) == 16);

struct OpConfig {
  uint32_t version = 1;
  const char* name = nullptr;
  const char* package = "qti.aisw";
  const char* type = nullptr;  // "MatMul", "RmsNorm", ...
  uint32_t n_params = 0;
  Param* params = nullptr;
  uint32_t n_inputs = 0;
  Tensor* inputs = nullptr;
  uint32_t n_outputs = 0;
  Tensor* outputs = nullptr;
};
static_assert(sizeof(OpConfig) == 80 && offsetof(OpConfig, name) == 8);

// Configurations are null-terminated arrays of pointers to {option; value}; option 0 (custom)
// points at a backend-specific struct.
struct Config {
  uint32_t option = 0;
  union {
    const void* custom;
    uint64_t u64 = 0;
  };
};
static_assert(sizeof(Config) == 16 && offsetof(Config, custom) == 8);

// HTP device: which chip to compile for. The SoC decides the arch (and whether graphs compute in
// fp16): always give it.
enum HtpDeviceOption : uint32_t { kHtpSoc = 0, kHtpArch = 1 };
struct HtpDeviceArch {
  uint32_t device_id;
  uint32_t arch;
};
struct HtpDeviceConfig {
  uint32_t option = kHtpSoc;
  uint32_t reserved = 0;
  union {
    uint32_t soc_model;
    HtpDeviceArch arch;
    uint64_t bits = 0;
  };
};
static_assert(sizeof(HtpDeviceConfig) == 16 && offsetof(HtpDeviceConfig, soc_model) == 8);

// HTP graph options.
enum HtpGraphOption : uint32_t { kHtpOptimization = 1, kHtpPrecision = 2, kHtpVtcmMb = 3 };
inline constexpr uint32_t kHtpFinalizeOptimizationFlag = 3;
struct HtpOptimization {
  uint32_t type;
  float value;
};
struct HtpGraphConfig {
  uint32_t option = kHtpOptimization;
  union {
    HtpOptimization optimization;
    uint32_t u32;
    uint64_t u64;  // (the largest members hold 64-bit fields)
    unsigned char bytes[48] = {};
  };
};
static_assert(sizeof(HtpGraphConfig) == 56 && offsetof(HtpGraphConfig, u32) == 8);

// HTP context options.
enum HtpContextOption : uint32_t { kHtpWeightSharing = 1 };
struct HtpContextConfig {
  uint32_t option = kHtpWeightSharing;
  union {
    uint8_t b8;
    uint64_t bits = 0;
    unsigned char bytes[16];
  };
};

enum LogLevel : uint32_t { kLogError = 1, kLogWarn = 2, kLogInfo = 3, kLogVerbose = 4 };
using LogCallback = void (*)(const char* format, uint32_t level, uint64_t timestamp, va_list args);

// What the device reports of itself (a phone's HTP; the simulator reports no hardware device).
struct HtpDeviceExtension {  // the HTP's extension of a hardware device's description
  uint32_t device_type;      // 0: on chip
  size_t vtcm_mb;
  uint32_t soc_model;
  uint8_t signed_pd, dlbc;
  uint32_t arch;
};
static_assert(offsetof(HtpDeviceExtension, soc_model) == 16 &&
              offsetof(HtpDeviceExtension, arch) == 24);
struct HardwareDeviceInfo {
  uint32_t version;   // 1
  uint32_t reserved;  // (its version's fields are a union, 8-aligned)
  uint32_t device_id, device_type, n_cores;
  const void* cores;
  const HtpDeviceExtension* extension;
};
static_assert(offsetof(HardwareDeviceInfo, device_id) == 8 &&
              offsetof(HardwareDeviceInfo, n_cores) == 16 &&
              offsetof(HardwareDeviceInfo, extension) == 32 && sizeof(HardwareDeviceInfo) == 40);
struct PlatformInfo {
  uint32_t version;   // 1
  uint32_t reserved;  // (as above)
  uint32_t n_devices;
  const HardwareDeviceInfo* devices;
};
static_assert(offsetof(PlatformInfo, n_devices) == 8 && offsetof(PlatformInfo, devices) == 16);

using Unused = void*;  // a slot of the table qhx does not call

// The core function table, in the order of core API 2.32 (71 slots; later APIs append).
struct FunctionTable {
  Unused property_has_capability;
  ErrorHandle (*backend_create)(Handle log, const Config** config, Handle* backend);
  Unused backend_set_config;
  ErrorHandle (*backend_get_api_version)(ApiVersion* version);
  ErrorHandle (*backend_get_build_id)(const char** id);
  Unused backend_register_op_package, backend_get_supported_operations, backend_validate_op_config;
  ErrorHandle (*backend_free)(Handle backend);
  ErrorHandle (*context_create)(Handle backend, Handle device, const Config** config,
                                Handle* context);
  Unused context_set_config;
  ErrorHandle (*context_get_binary_size)(Handle context, uint64_t* bytes);
  ErrorHandle (*context_get_binary)(Handle context, void* buffer, uint64_t capacity,
                                    uint64_t* written);
  ErrorHandle (*context_create_from_binary)(Handle backend, Handle device, const Config** config,
                                            const void* binary, uint64_t bytes, Handle* context,
                                            Handle profile);
  ErrorHandle (*context_free)(Handle context, Handle profile);
  ErrorHandle (*graph_create)(Handle context, const char* name, const Config** config,
                              Handle* graph);
  Unused graph_create_subgraph, graph_set_config;
  ErrorHandle (*graph_add_node)(Handle graph, OpConfig op);  // by value
  ErrorHandle (*graph_finalize)(Handle graph, Handle profile, Handle signal);
  ErrorHandle (*graph_retrieve)(Handle context, const char* name, Handle* graph);
  ErrorHandle (*graph_execute)(Handle graph, const Tensor* inputs, uint32_t n_inputs,
                               Tensor* outputs, uint32_t n_outputs, Handle profile, Handle signal);
  Unused graph_execute_async;
  Unused tensor_create_context_tensor;
  ErrorHandle (*tensor_create_graph_tensor)(Handle graph, Tensor* tensor);
  ErrorHandle (*log_create)(LogCallback callback, uint32_t max_level, Handle* log);
  Unused log_set_log_level;
  ErrorHandle (*log_free)(Handle log);
  Unused profile[7];
  Unused mem_register, mem_deregister;
  ErrorHandle (*device_get_platform_info)(Handle log, const PlatformInfo** info);
  ErrorHandle (*device_free_platform_info)(Handle log, const PlatformInfo* info);
  Unused device_get_infrastructure;
  ErrorHandle (*device_create)(Handle log, const Config** config, Handle* device);
  Unused device_set_config, device_get_info;
  ErrorHandle (*device_free)(Handle device);
  Unused signal[4];
  ErrorHandle (*error_get_message)(ErrorHandle error, const char** message);
  Unused later[22];
};
static_assert(sizeof(FunctionTable) == 71 * sizeof(void*));
static_assert(offsetof(FunctionTable, backend_get_build_id) == 4 * 8 &&
              offsetof(FunctionTable, backend_free) == 8 * 8 &&
              offsetof(FunctionTable, context_create) == 9 * 8 &&
              offsetof(FunctionTable, context_free) == 14 * 8 &&
              offsetof(FunctionTable, graph_create) == 15 * 8 &&
              offsetof(FunctionTable, graph_add_node) == 18 * 8 &&
              offsetof(FunctionTable, graph_execute) == 21 * 8 &&
              offsetof(FunctionTable, tensor_create_graph_tensor) == 24 * 8 &&
              offsetof(FunctionTable, log_create) == 25 * 8 &&
              offsetof(FunctionTable, device_create) == 40 * 8 &&
              offsetof(FunctionTable, device_free) == 43 * 8 &&
              offsetof(FunctionTable, error_get_message) == 48 * 8);

inline constexpr uint32_t kHtpBackendId = 6;
struct Interface {
  uint32_t backend_id;
  const char* provider_name;
  ApiVersion api_version;
  FunctionTable api;
};
static_assert(offsetof(Interface, api_version) == 16 && offsetof(Interface, api) == 40);
using GetProviders = ErrorHandle (*)(const Interface*** providers, uint32_t* count);
inline constexpr const char* kGetProviders = "QnnInterface_getProviders";

// QNN System: reading a context binary's description without loading it.
struct SystemFunctionTable {
  ErrorHandle (*context_create)(Handle* system_context);
  ErrorHandle (*context_get_binary_info)(Handle system_context, void* binary, uint64_t bytes,
                                         const void** info, uint64_t* info_bytes);
  Unused context_get_metadata;
  ErrorHandle (*context_free)(Handle system_context);
  Unused later[12];
};
struct SystemInterface {
  uint32_t backend_id;
  const char* provider_name;
  Version api_version;
  SystemFunctionTable api;
};
static_assert(offsetof(SystemInterface, api) == 32);
using GetSystemProviders = ErrorHandle (*)(const SystemInterface*** providers, uint32_t* count);
inline constexpr const char* kGetSystemProviders = "QnnSystemInterface_getProviders";

// A context binary's description, version 3 (what QNN 2.40's System returns; 1 and 2 keep a
// hardware blob where 3 has the context's metadata).
struct GraphInfo {
  uint32_t version;
  const char* name;
  uint32_t n_inputs;
  Tensor* inputs;
  uint32_t n_outputs;
  Tensor* outputs;
  uint32_t n_updateable;  // version 2 on
  Tensor* updateable;
  uint32_t blob_info_bytes;  // version 3: the backend's record of the graph
  const void* blob_info;
  uint32_t first_op, last_op;
};
static_assert(sizeof(GraphInfo) == 88 && offsetof(GraphInfo, name) == 8 &&
              offsetof(GraphInfo, blob_info) == 72);
struct BinaryInfoV3 {
  uint32_t backend_id;
  const char* build_id;
  Version core_api, backend_api;
  const char* soc_version;
  Version context_blob_version;
  uint64_t context_blob_bytes;
  uint32_t n_context_tensors;
  Tensor* context_tensors;
  uint32_t n_graphs;
  GraphInfo* graphs;
  void* platform_info;
  uint32_t metadata_bytes;
  const void* metadata;  // HTP: {version 1, dsp arch}
  uint32_t soc_model;
};
static_assert(offsetof(BinaryInfoV3, context_blob_bytes) == 64 &&
              offsetof(BinaryInfoV3, graphs) == 96 && offsetof(BinaryInfoV3, metadata) == 120 &&
              offsetof(BinaryInfoV3, soc_model) == 128);
struct BinaryInfo {
  uint32_t version;
  BinaryInfoV3 v3;
};
static_assert(offsetof(BinaryInfo, v3) == 8);

// The HTP's records of a graph in its binary (GraphInfo::blob_info): version 1, then 2.
struct HtpGraphRecordV1 {
  uint32_t version;
  uint64_t spill_fill_bytes;
  uint32_t vtcm_bytes;
  uint32_t optimization_level;
  uint8_t dlbc;
  uint64_t hvx_threads;
};
struct HtpGraphRecordV2 {
  uint32_t version;
  uint64_t native_k, native_v;
  uint32_t safe_share_io;
  uint64_t io_bytes, op_data_bytes, const_bytes, ddr_tensor_bytes, shared_weight_bytes;
};
static_assert(sizeof(HtpGraphRecordV1) == 40 && sizeof(HtpGraphRecordV2) == 72);
struct HtpContextMetadata {
  uint32_t version;
  uint32_t dsp_arch;
};

}  // namespace qhx::qnn
