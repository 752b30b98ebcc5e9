// A forward pass as a flat list of nodes over a closed vocabulary of model-shaped ops, in the
// order the spec reads. A model emits one plan per shape (a decode step, a prefill chunk, a
// tail); a scheduler (graph/schedule.h) places each node on a backend, inserts copies where a
// value crosses between backends, lets each backend fuse adjacent nodes, and reserves every
// backend's activation arena exactly, before anything runs. Running a plan allocates nothing.
//
// Every activation is a float32 row-major [rows, cols] value. Nodes read and write values at a
// row offset (the final norm reads only the rows whose logits are asked for) and reach the
// sequence's state (KV caches, conv and recurrent states) by layer index.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "graph/state_buffer.h"
#include "kernels/kernels.h"

namespace qhx {

// One layer's part of a sequence's state: softmax attention (a KV cache) or Gated DeltaNet (conv
// state + f32 recurrent state), in memory of the backend the sequence runs on.
struct LayerState {
  // Attention: [n_past, kv_row_floats] each, rows of the layer's KV type
  // (AttentionShape::kv_row_floats: n_kv_heads·head_dim for f32 rows).
  StateBuffer keys, values;
  int64_t kv_row_floats = 0;
  KvType kv = KvType::kF32;
  StateBuffer conv;       // Gated DeltaNet: the last kernel-1 inputs, [kernel-1, channels]
  StateBuffer recurrent;  // Gated DeltaNet: [n_v_heads, k_dim, v_dim]
};

enum class Op : uint8_t {
  kEmbed,        // out[t] = row ids[t] of `matrix`
  kRmsNorm,      // each `width` elements of in0: rms_norm with weight `vector`, eps
  kAdd,          // out += in0 (out is also read)
  kMatmul,       // out = in0 · matrixᵀ
  kCopyColumns,  // out = in0[:, offset : offset + out.cols]
  kSplitHeads,  // in0 [rows, heads·2·width] as [query | gate] per head: out = queries, out2 = gates
  kRope,        // in place on out: rotate-half RoPE of each `width`-element head at positions
                // first_pos + row, on its first rotary_dim elements (frequencies `vector`); with
                // `rope_axes`, frequency i turns by the row's position on axis rope_axes[i]
                // (RunInputs::positions: M-RoPE's temporal, height, width) when there are any
  kAttention,    // appends in1 (keys) and in2 (values) to layer's KV cache, then
                 // out = causal attention of queries in0 over the cache
  kSigmoidGate,  // out *= sigmoid(in0)
  kSiluMul,      // out = silu(in0) · in1 (out may be in0)
  kConvSilu,     // out = causal depthwise conv1d (weights `vector`, kernel `width`) of in0, then
                 // SiLU, continuing the layer's conv state
  kL2Norm,       // in place on out: each `width` elements L2-normalised (eps 1e-6), then × scale
  kDeltaGates,  // in place: out (b) becomes β = σ(b), out2 (a) g = −exp(a_log)·softplus(a + dt)
  kDeltaRule,   // out = gated delta rule of q in0, k in1, v in2, β in3, g in4, continuing the
                // layer's recurrent state (one token, or chunk 0: the recurrent step;
                // more: chunked)
  kLayerNorm,  // each `width` elements of in0: (x − mean) / sqrt(var + eps) · `vector` + `vector2`
  kAddBias,    // in place: every row of out += `vector`
  kGelu,       // in place: x · Φ(x) (erf)
  kGeluTanh,                // in place: transformers' gelu_pytorch_tanh
  kBidirectionalAttention,  // out = attention of queries in0 over all rows' keys in1 and values
                            // in2 (no mask, no cache): an image's patches see each other
  kCopy,                    // out = in0 (inserted by the scheduler where a value changes backend)
};
inline constexpr int kOpKinds = static_cast<int>(Op::kCopy) + 1;
const char* op_name(Op op);
// Ops whose output (out) is also an input, updated in place; and whose out2 is (delta gates).
bool updates_in_place(Op op);
bool updates_out2_in_place(Op op);

using ValueId = int32_t;
inline constexpr ValueId kNoValue = -1;

// A value at a row offset.
struct Operand {
  ValueId value = kNoValue;
  int64_t row = 0;
};

struct Value {
  int64_t rows = 0, cols = 0;
  // ≥ 0: bound by the caller at run time (RunInputs::external[binding], the logits), in CPU
  // memory rather than an arena.
  int binding = -1;
  int backend = 0;     // where it lives (the scheduler sets it)
  int64_t offset = 0;  // in floats, within that backend's arena (the scheduler sets it)
  int64_t floats() const { return rows * cols; }
  bool external() const { return binding >= 0; }
};

struct Node {
  Op op;
  Operand in[5];  // inputs, as the op reads them
  Operand out, out2;
  int64_t rows = 0;   // rows (tokens) the node processes
  int64_t width = 0;  // op-specific, as Op says
  int64_t offset = 0;
  float eps = 0.0f, scale = 1.0f;
  int layer = -1;                         // state of this layer (attention, conv, delta rule)
  const MatrixRef* matrix = nullptr;      // kEmbed, kMatmul
  const WeightVector* vector = nullptr;   // norm weights, conv weights, RoPE frequencies, a_log
  const WeightVector* vector2 = nullptr;  // kDeltaGates: dt_bias
  AttentionShape attention{};             // kAttention
  DeltaRuleShape heads{};                 // kDeltaRule
  int64_t rotary_dim = 0;                 // kRope
  const int8_t* rope_axes = nullptr;      // kRope: rotary_dim / 2 axes (0 t, 1 h, 2 w), or none
  int64_t chunk = 0;  // kDeltaRule: the prefill chunk of the WY form (0: recurrent)

  // Set by the scheduler: the backend that runs it, and how many of the nodes that follow it
  // run with it as one (fused by that backend).
  int backend = 0;
  int fused = 0;
};

struct Plan {
  int64_t n_tokens = 0;
  std::vector<Value> values;
  std::vector<Node> nodes;

  ValueId add_value(int64_t rows, int64_t cols, int binding = -1);
  Node& add(Op op);
  // "rms_norm x ← h (w 1024)": one line per node, for errors and tests.
  std::string describe(const Node& node) const;
};

// The weights a model's plans read, as its backends prepare them (Backend::prepare_weights):
// the matrices they multiply, the tables they look rows up in (an embedding, whose data may be a
// matrix's too: a tied lm-head), and the small vectors of norms, convs, gates and RoPE.
struct WeightList {
  std::vector<MatrixRef*> matrices, tables;
  std::vector<WeightVector*> vectors;
};

// Numbers the weights in that order, from 0 (MatrixRef::id, WeightVector::id): the ids a
// device keys its copies by, stable for a model (an NPU pack's calibrated ranges name them).
void number_weights(const WeightList& weights);

// What a plan runs on: the new tokens, where they start, the sequence's layers, and the external
// values' memory (by Value::binding; host memory, each buffer holding its value from byte 0).
struct RunInputs {
  std::span<const int32_t> ids = {};
  int64_t first_pos = 0;
  // M-RoPE positions of the rows, [3, rows] (temporal, height, width), for kRope nodes with
  // rope_axes; empty: first_pos + row on every axis.
  std::span<const int32_t> positions = {};
  std::span<LayerState> layers = {};
  std::span<Buffer* const> external = {};
};

}  // namespace qhx
