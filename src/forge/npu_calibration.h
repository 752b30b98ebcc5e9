// The activation ranges the NPU's 16-bit forms are compiled with (backend/qnn/npu_weights.h):
// the smallest and largest value each matmul of a model reads and writes, measured on the CPU as
// the model reads calibration text in prompt passes. forge npu records them in the pack.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/qnn/npu_weights.h"
#include "models/model.h"

namespace qhx {

struct CalibrationOptions {
  int64_t pass_tokens = 512;  // tokens per prompt pass (a sequence longer is read in passes)
  int64_t sequence_tokens =
      2048;                   // a text is cut into sequences of this many, each from position 0
  int64_t max_tokens = 4096;  // in all; sequences past it are left out
  int n_threads = 0;          // 0: the machine's cores
};

struct Calibration {
  ActivationRanges ranges;
  int64_t tokens = 0;  // read to measure them
};
// Ranges of every matmul the prompt passes of `sequences` (token ids, each read from a fresh
// state) reach, by weight id. Error when the bundle does not load, nothing was read, or a
// range is not finite (the model overflowed on the text).
Calibration calibrate_npu_ranges(const std::filesystem::path& bundle,
                                 std::span<const std::vector<int32_t>> sequences,
                                 const CalibrationOptions& options = {});

// The CPU context calibration computes on: n_threads, or the machine's cores when 0.
std::shared_ptr<CpuContext> calibration_context(int n_threads);

// Reads `sequences` with `model` in prompt passes of options.pass_tokens, each sequence from a
// fresh state, until options.max_tokens in all; returns the tokens read. Error naming `where`
// when it reads none.
int64_t read_calibration_passes(const Model& model, std::span<const std::vector<int32_t>> sequences,
                                const CalibrationOptions& options, const std::string& where);

// Token ids of calibration text files, cut into sequences of at most `sequence_tokens`, by the
// bundle's tokenizer (Error naming a file that cannot be read or a bundle without a tokenizer).
std::vector<std::vector<int32_t>> calibration_sequences(
    const std::filesystem::path& bundle, std::span<const std::filesystem::path> texts,
    int64_t sequence_tokens);

}  // namespace qhx
