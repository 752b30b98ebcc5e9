// qhx forge convert: Hugging Face checkpoint → bundle (docs/bundle.md). The bundle is written
// under a temporary name beside the output and renamed into place only after it passed the
// oracle gate, so a failed or interrupted convert never leaves a bundle behind.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "forge/calibrated_quant.h"
#include "runtime/gate.h"

namespace qhx {

struct ConvertOptions {
  DType weights = DType::kF32;   // decoder matrices
  std::optional<DType> lm_head;  // default: weights, but bf16 for w8/w4
  std::optional<DType> embed;    // default: weights, but bf16 for w8/w4
  int64_t group_size = 64;       // W4 group width
  // How W8/W4 matrices multiply their activations: int8 (quantized on the fly, the fast integer
  // kernels) or f32. Unset: int8 where the gate accepts it, else f32 (int8 when not gated).
  std::optional<bool> int8_activations;
  // Calibrated quantization (forge/calibrated_quant.h): W8/W4 matrices' scales and rounding chosen
  // for the inputs they meet when the checkpoint (in f32, on the CPU) reads these texts, at most
  // calibration_tokens of them. Empty: each weight rounded on its own (kernels/quant.h).
  std::vector<std::filesystem::path> calibration_texts;
  CalibrationMethod calibration_method = CalibrationMethod::kGptq;
  int64_t calibration_tokens = 4096;
  // Mixed precision (W4 only, with calibration): the bundle's weight bytes at most this (0: every
  // matrix W4), spent on keeping in W8 the matrices whose quantization alone costs the most KL
  // divergence on the first sensitivity_tokens calibration tokens, per byte W8 adds.
  uint64_t size_budget = 0;
  int64_t sensitivity_tokens = 512;
  int64_t shards = 1;            // decoder shards by layer range...
  uint64_t max_shard_bytes = 0;  // ...or as many as needed to stay under this size
  std::string target = "generic";
  int64_t max_context = 0;  // 0: the checkpoint's max_position_embeddings
  bool gate = true;
  std::optional<GateThresholds> thresholds;  // default: default_gate_thresholds(weights)
  GateSuiteOptions gate_suite;
  bool overwrite = false;
};

// The embedding table and lm_head of a quantized bundle default to bf16: the logits are a direct
// linear function of lm_head (no later layer averages its rounding), and tied checkpoints share
// the table with it.
DType default_table_dtype(DType weights);

struct ConvertResult {
  std::optional<GateReport> gate;
  // When int8 activations were tried first and failed the gate: that report (`gate` is then the
  // f32-activation one).
  std::optional<GateReport> int8_activation_gate;
  bool int8_activations = false;  // what the published bundle uses
  bool published = false;
  std::vector<std::string> notes;  // what of the checkpoint was left out, and why
};

// Throws Error on bad input; returns published = false (and leaves nothing at `out`) when the
// gate fails.
ConvertResult forge_convert(const std::filesystem::path& hf_dir, const std::filesystem::path& out,
                            const ConvertOptions& options);

// Runs the gate on an existing bundle against a reference (HF directory or bundle).
GateReport forge_gate(const std::filesystem::path& bundle, const std::filesystem::path& reference,
                      const std::optional<GateThresholds>& thresholds,
                      const GateSuiteOptions& suite);

std::optional<DType> parse_weight_dtype(std::string_view name);  // "f32", "bf16", "w8", ...

}  // namespace qhx
