// Verified before use: GPU drivers return wrong numbers often enough that a device is compared
// with the CPU on the user's machine before it is trusted. The first time a model runs on a
// device (a device, driver and model fingerprint), the gate's probe prompts (runtime/gate.h) run
// with the model's devices and on the CPU alone, and the gate's thresholds decide (docs/gate.md,
// docs/vulkan.md). A pass is cached on disk; a failure disables the model's devices, so the run
// continues on the CPU, with a one-line reason.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

#include "core/dtype.h"
#include "models/model.h"
#include "runtime/gate.h"
#include "tokenizer/tokenizer.h"
#include "util/cache_dir.h"

namespace qhx {

// always: check at every open; once: check unless a pass is cached; never: trust the device.
enum class DeviceCheckMode { kAlways, kOnce, kNever };
std::optional<DeviceCheckMode> parse_device_check_mode(std::string_view text);

struct DeviceCheckOptions {
  DeviceCheckMode mode = DeviceCheckMode::kOnce;
  std::filesystem::path cache_dir;  // where passes are kept; empty: nowhere (always checks)
  DType weights = DType::kBF16;     // the model's matrices: which of the gate's thresholds apply
  int64_t prompts = 3;              // of the gate's built-in suite
  int64_t greedy_tokens = 8;        // followed per prompt
};

struct DeviceCheckResult {
  bool passed = false;
  bool cached = false;   // a pass was found on disk
  bool checked = false;  // the probe ran now
  std::string summary;   // one line: what was measured, or why the device is not used
  GateReport report;     // the measures, when the probe ran to the end
};

// Checks the devices `model` was loaded with; `device` names them for the cache ("vulkan:0
// (llvmpipe ..., Mesa 22.3.6)": device and driver). On failure the model's devices are disabled.
// Run it before the model is shared: it switches the model between devices and CPU.
DeviceCheckResult check_devices(Model& model, const std::string& device, const Tokenizer* tokenizer,
                                const DeviceCheckOptions& options);

// The gate's thresholds a device check applies for `weights` (check_weights_for).
GateThresholds device_check_thresholds(DType weights);
// Which of the gate's thresholds apply to the model in `dir`: its bundle's matrix type (the
// manifest's precision policy); bf16 for a Hugging Face checkpoint.
DType check_weights_of(const std::filesystem::path& dir);
// The weights whose thresholds apply to devices: the coarsest of the model's (check_weights_of)
// and the forms the devices compute them in (Backend::computes_weights_as).
DType check_weights_for(const std::filesystem::path& dir,
                        std::span<const std::shared_ptr<Backend>> devices);

}  // namespace qhx
