#include "forge/npu_calibration.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "backend/cpu_backend.h"
#include "models/model.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"

namespace qhx {
namespace fs = std::filesystem;
namespace {

// A backend that takes every matmul and computes it with the CPU's kernels, unfused, noting the
// range of what it reads and writes: the scheduler places it as it would the NPU (a value it
// reads is materialized, whatever the CPU would have fused).
class RangeRecorder final : public Backend {
 public:
  explicit RangeRecorder(std::shared_ptr<CpuContext> context)
      : context_(std::move(context)), cpu_(*context_, /*fusion=*/false) {}

  std::string name() const override { return "calibration"; }
  const BufferType& buffer_type() const override { return cpu_.buffer_type(); }
  bool supports(const Node& node) const override {
    return node.op == Op::kMatmul || node.op == Op::kCopy;
  }
  bool claims(const Node& node) const override { return node.op == Op::kMatmul; }
  Buffer& arena(size_t bytes) override { return cpu_.arena(bytes); }
  void run(const Plan& plan, std::span<const Node> nodes, const NodeArgs& args) override {
    cpu_.run(plan, nodes, args);
    const Node& n = nodes.front();
    if (n.op != Op::kMatmul) return;
    if (n.matrix->id < 0) return;
    MatmulRanges& r = ranges_[n.matrix->id];
    const auto note = [&](const Operand& o, ActivationRange& range) {
      const TensorRef& t = args.values[o.value];
      const float* row = args.at(o);
      for (int64_t i = 0; i < n.rows; ++i, row += t.strides[0]) {
        for (int64_t c = 0; c < plan.values[o.value].cols; ++c) range.include(row[c]);
      }
    };
    note(n.in[0], r.in);
    note(n.out, r.out);
  }

  const ActivationRanges& ranges() const { return ranges_; }

 private:
  std::shared_ptr<CpuContext> context_;
  CpuBackend cpu_;
  ActivationRanges ranges_;
};

}  // namespace

Calibration calibrate_npu_ranges(const fs::path& bundle,
                                 std::span<const std::vector<int32_t>> sequences,
                                 const CalibrationOptions& options) {
  if (options.pass_tokens <= 0 || options.max_tokens <= 0) {
    fail("calibration", "pass_tokens and max_tokens must be positive");
  }
  const int threads = options.n_threads > 0
                          ? options.n_threads
                          : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  auto context = std::make_shared<CpuContext>(threads, CpuKernels::from_environment());
  auto recorder = std::make_shared<RangeRecorder>(context);
  const auto model = load_model(bundle, {.context = context, .devices = {recorder}});
  std::vector<float> logits;
  int64_t read = 0;
  for (const std::vector<int32_t>& ids : sequences) {
    if (read >= options.max_tokens) break;
    auto state = model->new_state();
    const int64_t n =
        std::min<int64_t>(static_cast<int64_t>(ids.size()), options.max_tokens - read);
    for (int64_t begin = 0; begin < n; begin += options.pass_tokens) {
      const int64_t count = std::min(options.pass_tokens, n - begin);
      model->forward(std::span(ids).subspan(begin, count), *state, LogitsFor::kLastToken, logits);
    }
    read += n;
  }
  if (read == 0 || recorder->ranges().empty()) {
    fail(bundle.string(), "calibration read no tokens (give text that is not empty)");
  }
  for (const auto& [weight, r] : recorder->ranges()) {
    for (const float v : {r.in.lo, r.in.hi, r.out.lo, r.out.hi}) {
      if (!std::isfinite(v)) {
        fail(bundle.string(), "matrix " + std::to_string(weight) +
                                  " read or wrote a value that is not finite on the calibration "
                                  "text");
      }
    }
  }
  return {recorder->ranges(), read};
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
