#include "forge/npu_calibration.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "forge/matmul_observer.h"
#include "models/model.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"

namespace qhx {
namespace fs = std::filesystem;

Calibration calibrate_npu_ranges(const fs::path& bundle,
                                 std::span<const std::vector<int32_t>> sequences,
                                 const CalibrationOptions& options) {
  auto context = calibration_context(options.n_threads);
  // The range of what each matmul reads and writes.
  ActivationRanges ranges;
  const auto note = [](const float* row, int64_t stride, int64_t rows, int64_t cols,
                       ActivationRange& range) {
    for (int64_t i = 0; i < rows; ++i, row += stride) {
      for (int64_t c = 0; c < cols; ++c) range.include(row[c]);
    }
  };
  auto recorder = std::make_shared<MatmulObserver>(context, [&](const ObservedMatmul& m) {
    if (m.w.id < 0) return;
    MatmulRanges& r = ranges[m.w.id];
    note(m.x, m.x_stride, m.rows, m.w.cols, r.in);
    note(m.y, m.y_stride, m.rows, m.w.rows, r.out);
  });
  const auto model = load_model(bundle, {.context = context, .devices = {recorder}});
  const int64_t read = read_calibration_passes(*model, sequences, options, bundle.string());
  if (ranges.empty()) fail(bundle.string(), "calibration reached no matrix");
  for (const auto& [weight, r] : ranges) {
    for (const float v : {r.in.lo, r.in.hi, r.out.lo, r.out.hi}) {
      if (!std::isfinite(v)) {
        fail(bundle.string(), "matrix " + std::to_string(weight) +
                                  " read or wrote a value that is not finite on the calibration "
                                  "text");
      }
    }
  }
  return {ranges, read};
}

std::shared_ptr<CpuContext> calibration_context(int n_threads) {
  const int threads = n_threads > 0
                          ? n_threads
                          : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  return std::make_shared<CpuContext>(threads, CpuKernels::from_environment());
}

int64_t read_calibration_passes(const Model& model, std::span<const std::vector<int32_t>> sequences,
                                const CalibrationOptions& options, const std::string& where) {
  if (options.pass_tokens <= 0 || options.max_tokens <= 0) {
    fail("calibration", "pass_tokens and max_tokens must be positive");
  }
  std::vector<float> logits;
  int64_t read = 0;
  for (const std::vector<int32_t>& ids : sequences) {
    if (read >= options.max_tokens) break;
    auto state = model.new_state();
    const int64_t n =
        std::min<int64_t>(static_cast<int64_t>(ids.size()), options.max_tokens - read);
    for (int64_t begin = 0; begin < n; begin += options.pass_tokens) {
      const int64_t count = std::min(options.pass_tokens, n - begin);
      model.forward(std::span(ids).subspan(begin, count), *state, LogitsFor::kLastToken, logits);
    }
    read += n;
  }
  if (read == 0) fail(where, "calibration read no tokens (give text that is not empty)");
  return read;
}

std::vector<std::vector<int32_t>> calibration_sequences(const fs::path& bundle,
                                                        std::span<const fs::path> texts,
                                                        int64_t sequence_tokens) {
  if (texts.empty()) return {};
  if (sequence_tokens <= 0) fail("calibration", "sequence_tokens must be positive");
  if (!fs::exists(bundle / "tokenizer.json")) {
    fail(bundle.string(), "has no tokenizer.json to read calibration text with");
  }
  const Tokenizer tokenizer = Tokenizer::load(bundle);
  std::vector<std::vector<int32_t>> out;
  for (const fs::path& path : texts) {
    std::ifstream file(path, std::ios::binary);
    if (!file) fail(path.string(), "calibration text cannot be read");
    std::ostringstream text;
    text << file.rdbuf();
    const std::vector<int32_t> ids = tokenizer.encode(text.str(), path.string());
    for (size_t begin = 0; begin < ids.size(); begin += static_cast<size_t>(sequence_tokens)) {
      const size_t end = std::min(ids.size(), begin + static_cast<size_t>(sequence_tokens));
      out.emplace_back(ids.begin() + static_cast<std::ptrdiff_t>(begin),
                       ids.begin() + static_cast<std::ptrdiff_t>(end));
    }
  }
  return out;
}

}  // namespace qhx
