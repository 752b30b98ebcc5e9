// The shapes compute works on, shared by the file formats, the kernels, the plan and every
// backend: tensors in their buffers, weight matrices as they lie in memory, and the head layouts
// of the two attentions.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "core/buffer.h"
#include "core/dtype.h"
#include "core/kv_layout.h"

namespace qhx {

// How a matmul multiplies a quantized (W8/W4) matrix: with the float32 activations, or with the
// activations quantized on the fly to int8 (llama.cpp's Q8_0 layout), so the dot products run in
// integer arithmetic. Float matrices always use float32 activations.
enum class Activations : uint8_t { kF32, kInt8 };

// Dynamic int8 activations: each token's row is cut into blocks of kActivationBlock columns, each
// with its own scale, so one outlier costs precision only in its block.
inline constexpr int64_t kActivationBlock = 32;

// A tensor where it lives: dtype, shape and strides (in elements) in a buffer at a byte offset.
// Backends receive their operands this way; one whose kernels address the host reads
// host<T>(), any other its own handle of `buffer`.
struct TensorRef {
  static constexpr int kMaxDims = 4;
  Buffer* buffer = nullptr;
  size_t offset = 0;  // bytes
  DType dtype = DType::kF32;
  int rank = 0;
  int64_t shape[kMaxDims] = {};
  int64_t strides[kMaxDims] = {};

  // A row-major [rows, cols] f32 matrix (row stride cols).
  static TensorRef rows_of_floats(Buffer* buffer, size_t offset, int64_t rows, int64_t cols) {
    TensorRef t{buffer, offset, DType::kF32, 2, {rows, cols}, {cols, 1}};
    return t;
  }
  // Null when the host cannot address the buffer.
  template <typename T>
  T* host() const {
    return buffer == nullptr || buffer->host() == nullptr
               ? nullptr
               : reinterpret_cast<T*>(buffer->host() + offset);
  }
};

// A row-major [rows, cols] matrix used where it lies (usually in a mapped weight file).
// Quantized weights are symmetric, w ≈ scale · q, with `data` holding q and `scales` the scales:
//   W8: q int8 [rows, cols] in [-127, 127]; one f32 scale per row, [rows].
//   W4: q int4 in [-7, 7] (two's complement), two per byte, cols/2 bytes per row: byte b holds
//       column 2b in its low nibble and column 2b+1 in its high nibble. One scale (f16 bits) per
//       group_size consecutive columns of a row, [rows, cols/group_size]; group_size is even
//       and divides cols (kernels/quant.h checks layouts and writes them).
struct MatrixRef {
  DType dtype = DType::kF32;
  const void* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  const void* scales = nullptr;                 // W8 and W4 only
  int64_t group_size = 0;                       // W4 only
  Activations activations = Activations::kF32;  // W8 and W4 only
  // The same matrix laid out for this CPU's int8 kernels (pack_for_int8_kernels,
  // kernels/matmul_int8.h), or null: the kernels then read `data` as it lies.
  const void* packed = nullptr;
  // Where `data` lies (a mapped weight file, a backend's memory): the scheduler runs a node on
  // its weights' home. Null: host memory its owner keeps alive.
  const Buffer* buffer = nullptr;
  // Its place in its model's list of weights, numbered as the model loads (number_weights,
  // graph/backend.h): what a device keys its copy by and names it by in what it compiles (an
  // NPU graph's key, calibrated ranges). -1: not numbered (weights only the CPU reads).
  int64_t id = -1;
};

// A small f32 weight vector of a model (norm scales, conv weights, gate parameters, RoPE
// frequencies), owned here, numbered with the model's matrices (MatrixRef::id).
struct WeightVector {
  WeightVector() = default;
  WeightVector(std::vector<float> v) : values(std::move(v)) {}  // NOLINT: values become weights
  const float* data() const { return values.data(); }
  int64_t size() const { return static_cast<int64_t>(values.size()); }
  bool empty() const { return values.empty(); }
  float operator[](size_t i) const { return values[i]; }

  std::vector<float> values;
  int64_t id = -1;
};

// One matrix of several that multiply the same activations, and where its product goes.
struct MatmulOutput {
  const MatrixRef& w;
  float* y;
};

// Shape of grouped-query attention: query head h reads key/value head h / (n_heads/n_kv_heads),
// from a KV cache whose rows are of type `kv` (core/kv_layout.h).
struct AttentionShape {
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;
  KvType kv = KvType::kF32;
  // Floats of storage one cached position's keys (or values) take.
  int64_t kv_row_floats() const { return n_kv_heads * kv_head_floats(kv, head_dim); }
};

// Heads of a gated delta rule: value head j reads key head j / (n_v_heads / n_k_heads).
struct DeltaRuleShape {
  int64_t n_k_heads = 0;
  int64_t n_v_heads = 0;
  int64_t k_dim = 0;
  int64_t v_dim = 0;
};

}  // namespace qhx
