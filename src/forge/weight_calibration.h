// What calibrated quantization measures on calibration text (forge convert --calibrate): each
// matrix's input statistics, read as the float model runs the text on the CPU.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "forge/npu_calibration.h"

namespace qhx {

// Σ x xᵀ over the calibration rows a matrix read, [cols, cols] row-major, and their number.
struct InputGram {
  int64_t cols = 0;
  int64_t rows = 0;
  std::vector<double> sum;
};

struct InputStatistics {
  // By the checkpoint's tensor name; matrices that read the same input (q/k/v, gate/up) share
  // one.
  std::map<std::string, std::shared_ptr<const InputGram>> grams;
  int64_t tokens = 0;  // read to measure them
};

// The statistics of every matrix of the checkpoint's text model that the prompt passes of
// `sequences` (token ids, each from a fresh state) reach. Error when nothing was read or an
// input was not finite.
InputStatistics collect_input_statistics(const std::filesystem::path& checkpoint,
                                         std::span<const std::vector<int32_t>> sequences,
                                         const CalibrationOptions& options = {});

// A matrix of the checkpoint in another form (its quantized encoding), by its tensor name.
struct StandIn {
  std::string name;
  MatrixRef matrix;
};

// For each stand-in alone, the mean KL divergence of the model's predictions from the float
// model's over `ids` (one pass from an empty state): what quantizing that matrix alone costs,
// which forge's mixed precision reads to keep the costliest in W8. Error naming a stand-in the
// checkpoint has no matrix of.
std::vector<double> measure_sensitivity(const std::filesystem::path& checkpoint,
                                        std::span<const int32_t> ids,
                                        std::span<const StandIn> stand_ins, int n_threads = 0);

}  // namespace qhx
