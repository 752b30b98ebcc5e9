#include "runtime/device_check.h"

#include <fstream>

#include "io/bundle.h"
#include "runtime/gate.h"
#include "util/json_file.h"
#include "util/partial_path.h"
#include "util/sha256.h"

namespace qhx {
namespace {

namespace fs = std::filesystem;

// The model with its devices off: the gate's reference. Each pass puts the model's setting back
// as it found it (a device that failed during the check stays off). Valid while nothing else
// runs the model.
class CpuAlone final : public Model {
 public:
  explicit CpuAlone(Model& model) : model_(model) {}
  const ModelConfig& config() const override { return model_.config(); }
  CpuContext& context() const override { return model_.context(); }
  const std::string& fingerprint() const override { return model_.fingerprint(); }
  int64_t weights_bytes() const override { return model_.weights_bytes(); }
  int64_t decode_step_bytes(int64_t context) const override {
    return model_.decode_step_bytes(context);
  }
  std::unique_ptr<ModelState> new_state() const override { return model_.new_state(); }
  void forward(std::span<const int32_t> ids, ModelState& state, LogitsFor which,
               std::vector<float>& logits, std::vector<float>* hidden) const override {
    const bool enabled = model_.devices_enabled();
    model_.set_devices_enabled(false);
    try {
      model_.forward(ids, state, which, logits, hidden);
    } catch (...) {
      model_.set_devices_enabled(enabled);
      throw;
    }
    model_.set_devices_enabled(enabled);
  }
  int64_t activation_bytes(int64_t n_tokens) const override {
    return model_.activation_bytes(n_tokens);
  }

 private:
  Model& model_;
};

}  // namespace

// The device's numbers differ from the CPU's by arithmetic order (and a rare int8 rounding of an
// activation), never by more than bf16 weights differ from f32 ones: f32 and 16-bit models are
// held to the gate's bf16 thresholds, quantized ones to their own. Greedy continuations are
// reported, not required (a near-tie may flip, as in the gate).
GateThresholds device_check_thresholds(DType weights) {
  GateThresholds t = default_gate_thresholds(is_quantized(weights) ? weights : DType::kBF16);
  t.min_greedy = 0.0;
  return t;
}

namespace {

fs::path cache_file(const fs::path& dir, const std::string& device, const Model& model) {
  Sha256 key;
  key.update(device);
  key.update("\n");
  key.update(model.fingerprint());
  return dir / "device-checks" / (key.hex().substr(0, 32) + ".json");
}

bool cached_pass(const fs::path& file) {
  std::error_code ec;
  if (!fs::is_regular_file(file, ec)) return false;
  try {
    const Json entry = read_json_file(file);
    return entry.is_object() && entry.contains("passed") && entry.at("passed") == true;
  } catch (const Error&) {
    return false;  // a damaged cache entry is checked again, not trusted
  }
}

void remember_pass(const fs::path& file, const std::string& device, const Model& model,
                   const std::string& summary) {
  std::error_code ec;
  fs::create_directories(file.parent_path(), ec);
  if (ec) return;  // an unwritable cache costs a check next time, nothing more
  const fs::path partial = partial_sibling(file);
  {
    std::ofstream out(partial);
    out << Json{{"device", device},
                {"model", model.fingerprint()},
                {"passed", true},
                {"summary", summary}}
               .dump(2)
        << "\n";
    if (!out) return;
  }
  fs::rename(partial, file, ec);
}

}  // namespace

std::optional<DeviceCheckMode> parse_device_check_mode(std::string_view text) {
  if (text == "always") return DeviceCheckMode::kAlways;
  if (text == "once") return DeviceCheckMode::kOnce;
  if (text == "never") return DeviceCheckMode::kNever;
  return std::nullopt;
}

DType check_weights_of(const fs::path& dir) {
  if (!is_bundle(dir)) return DType::kBF16;
  const std::string matrices =
      open_bundle_manifest(dir, {}).precision_policy.value("matrices", std::string());
  return matrices == "w4" ? DType::kW4 : matrices == "w8" ? DType::kW8 : DType::kBF16;
}

DType check_weights_for(const fs::path& dir, std::span<const std::shared_ptr<Backend>> devices) {
  const auto coarseness = [](DType d) { return d == DType::kW4 ? 2 : d == DType::kW8 ? 1 : 0; };
  DType weights = check_weights_of(dir);
  for (const auto& d : devices) {
    if (coarseness(d->computes_weights_as()) > coarseness(weights)) {
      weights = d->computes_weights_as();
    }
  }
  return weights;
}

DeviceCheckResult check_devices(Model& model, const std::string& device, const Tokenizer* tokenizer,
                                const DeviceCheckOptions& options) {
  DeviceCheckResult result;
  if (!model.has_devices()) {
    result.passed = true;
    return result;
  }
  if (const std::string why = model.device_load_failure(); !why.empty()) {
    result.summary = device + " failed as the model loaded (" + why + "); running on the CPU";
    return result;
  }
  if (options.mode == DeviceCheckMode::kNever) {
    result.passed = true;
    result.summary = device + " is used unchecked (--device-check never)";
    return result;
  }
  const fs::path file =
      options.cache_dir.empty() ? fs::path() : cache_file(options.cache_dir, device, model);
  if (options.mode == DeviceCheckMode::kOnce && !file.empty() && cached_pass(file)) {
    result.passed = result.cached = true;
    result.summary = device + " passed its check before (" + file.string() + ")";
    return result;
  }
  std::vector<GatePrompt> suite =
      gate_prompt_suite(tokenizer, model.config().vocab_size, options.prompts);
  // A device that takes prompts in whole chunks (an NPU's 128 rows) is checked on prompts a
  // chunk and a few tokens long (its own text repeated): shorter ones would never reach it, and
  // the tail shows the hand-off to the CPU.
  if (const int64_t whole = model.prompt_rows_multiple(); whole > 1) {
    for (GatePrompt& p : suite) {
      const std::vector<int32_t> text = p.ids;
      while (!text.empty() && static_cast<int64_t>(p.ids.size()) < whole + 5) {
        p.ids.insert(p.ids.end(), text.begin(), text.end());
      }
    }
  }
  const CpuAlone cpu(model);
  GateReport report;
  result.checked = true;
  try {
    report = run_gate(model, cpu, suite, options.greedy_tokens,
                      device_check_thresholds(options.weights));
  } catch (const Error& e) {
    model.set_devices_enabled(false);
    result.summary = device + " failed its check (" + e.what() + "); running on the CPU";
    return result;
  }
  if (model.device_failures() > 0) {  // the pass fell back to the CPU part-way
    model.set_devices_enabled(false);
    result.summary =
        device + " failed during its check (" + model.device_failure() + "); running on the CPU";
    return result;
  }
  result.passed = report.passed;
  result.report = report;
  if (!report.passed) {
    model.set_devices_enabled(false);
    std::string failures;
    for (const std::string& f : report.failures) failures += (failures.empty() ? "" : ", ") + f;
    result.summary = device + " disagrees with the CPU (" + failures + "); running on the CPU";
    return result;
  }
  result.summary = device + " agrees with the CPU: " + report.summary();
  if (!file.empty()) remember_pass(file, device, model, result.summary);
  return result;
}

}  // namespace qhx
