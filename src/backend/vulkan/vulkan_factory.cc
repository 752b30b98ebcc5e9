// The Vulkan devices (backend/device_factory.h): "vulkan" (device 0) or "vulkan:N", and the test
// switches of docs/vulkan.md read from the environment as a backend opens.
#include <charconv>
#include <cstdlib>

#include "backend/device_factory.h"
#include "backend/vulkan/vulkan_backend.h"
#include "util/cache_dir.h"
#include "util/error.h"

namespace qhx {
namespace {

// A batch of one token reads every weight once: decode is bound by memory bandwidth. A discrete
// GPU's memory is several times the CPU's, so it decodes there; an integrated GPU (a phone's, a
// laptop's) shares the CPU's memory and decodes no faster, while the CPU does it without
// submissions; so does a CPU-type device (lavapipe).
bool decode_on_device(const VulkanDeviceInfo& d) {
  return d.discrete;
}

VulkanBackendOptions options_from_environment() {
  VulkanBackendOptions options;
  if (const char* n = std::getenv("QHX_VULKAN_FAIL_SUBMISSION")) {
    options.fail_submission = std::atoll(n);
  }
  if (const char* n = std::getenv("QHX_VULKAN_FAIL_ALLOCATION")) {
    options.fail_allocation = std::atoll(n);
  }
  if (const char* op = std::getenv("QHX_VULKAN_PERTURB")) options.perturb_op = op;
  if (const char* p = std::getenv("QHX_VULKAN_PORTABLE")) options.portable = std::string(p) == "1";
  if (const char* s = std::getenv("QHX_VULKAN_PRIVATE_STATES")) {
    options.private_states = std::string(s) == "1";
  }
  if (const char* u = std::getenv("QHX_VULKAN_UPLOAD_WEIGHTS")) {
    options.weights_in_place = std::string(u) != "1";
  }
  return options;
}

class VulkanFactory final : public DeviceFactory {
 public:
  std::string_view kind() const override { return "vulkan"; }
  std::string_view forms() const override { return "vulkan or vulkan:N"; }

  std::string canonical(std::string_view param, std::string_view option) const override {
    if (param.empty()) return "vulkan:0";
    int index = -1;
    const auto [end, ec] = std::from_chars(param.data(), param.data() + param.size(), index);
    if (ec != std::errc{} || end != param.data() + param.size() || index < 0) {
      std::string message = "vulkan:";
      message += param;
      message += " names no device (vulkan or vulkan:N)";
      fail(option, message);
    }
    return "vulkan:" + std::to_string(index);
  }

  std::vector<std::string> describe(std::string* why) const override {
    std::vector<std::string> lines;
    for (const VulkanDeviceInfo& d : vulkan_devices(why)) {
      lines.push_back("vulkan:" + std::to_string(d.index) + "  " + d.describe());
    }
    return lines;
  }

  OpenedDevice open(std::string_view param, std::optional<bool> decode,
                    const DeviceSettings& settings) const override {
    const int index = std::atoi(std::string(param).c_str());
    const std::shared_ptr<VulkanDevice> device = VulkanDevice::open(index, default_cache_dir());
    VulkanBackendOptions options = options_from_environment();
    options.decode = decode.value_or(decode_on_device(device->info()));
    options.profile = settings.contains("profile");  // qhx bench --profile
    OpenedDevice out;
    out.backend = std::make_shared<VulkanBackend>(device, options);
    out.decodes = options.decode;
    out.summary =
        "vulkan:" + std::to_string(index) + " (" + device->info().name + ") reads prompts; " +
        (options.decode ? "it decodes too (a discrete GPU)"
                        : "the CPU decodes (the device shares its memory: no faster at one token)");
    return out;
  }

  std::vector<SuiteVariant> op_suite_variants(std::string* why) const override {
    if (vulkan_devices(why).empty()) return {};
    const std::shared_ptr<VulkanDevice> device = VulkanDevice::open(0);
    // A phone-like device too: only the portable shaders, storage-buffer bindings so small that
    // every weight matrix and every long KV cache is bound in parts, and binding offsets aligned
    // to 256 bytes (windows start before their operands' first bytes).
    VulkanBackendOptions constrained;
    constrained.portable = true;
    constrained.max_binding_bytes = 1024;
    constrained.offset_alignment = 256;
    // The device's faster shaders on matrices bound in such parts (their rows start anywhere in
    // a 64-row tile of the cooperative-matrix matmul, and at word offsets in their binding).
    VulkanBackendOptions split = constrained;
    split.portable = false;
    const auto maker = [device](VulkanBackendOptions options) {
      return [device, options] { return std::make_shared<VulkanBackend>(device, options); };
    };
    return {{VulkanBackend(device).name(), maker({})},
            {"a constrained vulkan:0", maker(constrained)},
            {"vulkan:0 with matrices in parts", maker(split), /*matmuls_only=*/true}};
  }
  std::string_view required_switch() const override { return "QHX_REQUIRE_VULKAN"; }
};

}  // namespace

std::unique_ptr<DeviceFactory> make_vulkan_factory() {
  return std::make_unique<VulkanFactory>();
}

}  // namespace qhx
