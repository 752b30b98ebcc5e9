#include "backend/devices.h"

#include <charconv>
#include <cstdio>
#include <cstdlib>

#include "util/cache_dir.h"
#include "util/error.h"

#if QHX_HAVE_VULKAN
#include "backend/vulkan/vulkan_backend.h"
#endif

namespace qhx {

std::string DeviceName::text() const {
  return kind == Kind::kCpu ? "cpu" : "vulkan:" + std::to_string(index);
}

DeviceName parse_device_name(std::string_view text, std::string_view option) {
  if (text == "cpu") return {};
  if (text == "vulkan") return {DeviceName::Kind::kVulkan, 0};
  if (text.starts_with("vulkan:")) {
    const std::string_view digits = text.substr(7);
    int index = -1;
    const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), index);
    if (ec == std::errc{} && end == digits.data() + digits.size() && !digits.empty() &&
        index >= 0) {
      return {DeviceName::Kind::kVulkan, index};
    }
  }
  std::string message(text);  // (built up: g++ 12 warns falsely on "'" + std::string)
  message += " names no device (cpu, vulkan or vulkan:N)";
  fail(option, message);
}

#if QHX_HAVE_VULKAN

bool vulkan_built() {
  return true;
}

std::vector<std::string> describe_devices(std::string* why) {
  std::vector<std::string> lines;
  for (const VulkanDeviceInfo& d : vulkan_devices(why)) {
    lines.push_back("vulkan:" + std::to_string(d.index) + "  " + d.describe());
  }
  return lines;
}

namespace {

// A batch of one token reads every weight once: decode is bound by memory bandwidth. A discrete
// GPU's memory is several times the CPU's, so it decodes there; an integrated GPU (a phone's, a
// laptop's) shares the CPU's memory and decodes no faster, while the CPU does it without
// submissions; so does a CPU-type device (lavapipe).
bool decode_on_device(const VulkanDeviceInfo& d) {
  return d.discrete;
}

}  // namespace

OpenedDevices open_devices(const DeviceChoice& choice) {
  OpenedDevices out;
  const DeviceName cpu;
  if (choice.prefill == cpu) {
    if (choice.decode && *choice.decode != cpu) {
      fail("--decode-device", "decoding on " + choice.decode->text() +
                                  " needs the prompt there too (--device " + choice.decode->text() +
                                  ")");
    }
    return out;
  }
  if (choice.decode && *choice.decode != cpu && *choice.decode != choice.prefill) {
    fail("--decode-device", "decoding on " + choice.decode->text() + " while prompts run on " +
                                choice.prefill.text() + ": one device per model");
  }
  std::shared_ptr<VulkanDevice> device;
  try {
    device = VulkanDevice::open(choice.prefill.index, default_cache_dir());
  } catch (const Error& e) {
    out.note = std::string(e.what()) + "; running on the CPU";
    return out;
  }
  const bool decode = choice.decode ? *choice.decode != cpu : decode_on_device(device->info());
  VulkanBackendOptions options;
  options.decode = decode;
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
  out.backends.push_back(std::make_shared<VulkanBackend>(device, options));
  out.prefill = choice.prefill;
  out.decode = decode ? choice.prefill : cpu;
  if (!choice.decode) {
    out.note = choice.prefill.text() + " (" + device->info().name + ") reads prompts; " +
               (decode ? "it decodes too (a discrete GPU)"
                       : "the CPU decodes (the device shares its memory: no faster at one token)");
  }
  return out;
}

#else

bool vulkan_built() {
  return false;
}

std::vector<std::string> describe_devices(std::string* why) {
  if (why != nullptr) {
    *why = "qhx was built without Vulkan (QHX_VULKAN=OFF, or no libvulkan-dev and glslc)";
  }
  return {};
}

OpenedDevices open_devices(const DeviceChoice& choice) {
  OpenedDevices out;
  if (choice.prefill.kind != DeviceName::Kind::kCpu ||
      (choice.decode && choice.decode->kind != DeviceName::Kind::kCpu)) {
    out.note = "qhx was built without Vulkan; running on the CPU";
  }
  return out;
}

#endif

std::string describe_weight_memory(const OpenedDevices& devices) {
  if (devices.backends.empty()) return "";
  const WeightMemory w = devices.backends[0]->weight_memory();
  if (w.in_place_bytes + w.copied_bytes == 0) return "";
  char line[160];
  std::snprintf(line, sizeof line,
                "reads %.1f MB of weights in place from the mapped files, %.1f MB from copies",
                static_cast<double>(w.in_place_bytes) / 1e6,
                static_cast<double>(w.copied_bytes) / 1e6);
  return devices.prefill.text() + " " + line;
}

}  // namespace qhx
