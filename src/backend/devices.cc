#include "backend/devices.h"

#include <algorithm>
#include <cstdio>

#include "util/error.h"

namespace qhx {
namespace {

// The factories, made once: each is immutable.
struct Registry {
  std::vector<std::unique_ptr<DeviceFactory>> owned;
  std::vector<const DeviceFactory*> factories;
  Registry() {
    owned.push_back(make_vulkan_factory());
    owned.push_back(make_hexagon_factory());
    for (const auto& f : owned) factories.push_back(f.get());
  }
};

const DeviceFactory* factory_of(std::string_view kind) {
  for (const DeviceFactory* f : device_factories()) {
    if (f->kind() == kind) return f;
  }
  return nullptr;
}

std::string kinds_help() {
  std::string help = "cpu";
  for (const DeviceFactory* f : device_factories()) help += ", " + std::string(f->forms());
  return help;
}

class UnbuiltFactory final : public DeviceFactory {
 public:
  UnbuiltFactory(std::string kind, std::string forms, std::string why)
      : kind_(std::move(kind)), forms_(std::move(forms)), why_(std::move(why)) {}
  std::string_view kind() const override { return kind_; }
  std::string_view forms() const override { return forms_; }
  std::string canonical(std::string_view param, std::string_view) const override {
    return param.empty() ? kind_ : kind_ + ":" + std::string(param);
  }
  std::vector<std::string> describe(std::string* why) const override {
    if (why != nullptr) *why = why_;
    return {};
  }
  OpenedDevice open(std::string_view, std::optional<bool>, const DeviceSettings&) const override {
    fail(kind_, why_);
  }
  std::vector<SuiteVariant> op_suite_variants(std::string* why) const override {
    *why = why_;
    return {};
  }
  std::string_view required_switch() const override { return ""; }  // nothing to require

 private:
  std::string kind_, forms_, why_;
};

}  // namespace

std::unique_ptr<DeviceFactory> unbuilt_device_factory(std::string kind, std::string forms,
                                                      std::string why) {
  return std::make_unique<UnbuiltFactory>(std::move(kind), std::move(forms), std::move(why));
}

std::span<const DeviceFactory* const> device_factories() {
  static const Registry registry;
  return registry.factories;
}

std::string DeviceName::text() const {
  return param.empty() ? kind : kind + ":" + param;
}

DeviceName parse_device_name(std::string_view text, std::string_view option) {
  if (text == "cpu") return {};
  const size_t colon = text.find(':');
  const std::string_view kind = text.substr(0, colon);
  const DeviceFactory* factory = factory_of(kind);
  if (factory == nullptr) {
    std::string message(text);  // (built up: g++ 12 warns falsely on "'" + std::string)
    message += " names no device (" + kinds_help() + ")";
    fail(option, message);
  }
  const std::string_view param = colon == std::string_view::npos ? "" : text.substr(colon + 1);
  const std::string canonical = factory->canonical(param, option);
  const size_t split = canonical.find(':');
  return {std::string(kind), split == std::string::npos ? "" : canonical.substr(split + 1)};
}

std::vector<std::string> describe_devices() {
  std::vector<std::string> lines;
  for (const DeviceFactory* f : device_factories()) {
    std::string reason;
    const std::vector<std::string> some = f->describe(&reason);
    lines.insert(lines.end(), some.begin(), some.end());
    if (some.empty()) {
      std::string line(f->kind());
      line.resize(std::max<size_t>(line.size() + 2, 10), ' ');
      lines.push_back(line + "none: " + reason);
    }
  }
  return lines;
}

OpenedDevices open_devices(const DeviceChoice& given) {
  DeviceChoice choice = given;
  // A decode device of the prompt device's kind is that device ("--device hexagon:v81
  // --decode-device hexagon"); naming another of the kind is an error (one device of a kind reads
  // the prompt and decodes: two would both compute states).
  if (choice.decode && choice.decode->kind == choice.prefill.kind) {
    const std::string& p = choice.prefill.param;
    const std::string& d = choice.decode->param;
    if (!p.empty() && !d.empty() && p != d) {
      fail("--decode-device", "decoding on " + choice.decode->text() + " while prompts run on " +
                                  choice.prefill.text() + ": one device of a kind takes both");
    }
    choice.decode = choice.prefill;
  }
  OpenedDevices out;
  if (choice.prefill.is_cpu()) {
    if (choice.decode && !choice.decode->is_cpu()) {
      fail("--decode-device", "decoding on " + choice.decode->text() +
                                  " needs the prompt there too (--device " + choice.decode->text() +
                                  ")");
    }
    return out;
  }
  const DeviceFactory* factory = factory_of(choice.prefill.kind);
  if (factory == nullptr) fail("--device", choice.prefill.text() + " names no device");
  // Replies decoded on another device than the prompt's (an NPU's prompt chunks, a GPU's replies):
  // two backends in one model, the prompt's first (its work is placed first). Only after a
  // device that decodes nothing: two that decode would both compute states.
  const bool other_decoder =
      choice.decode && !choice.decode->is_cpu() && *choice.decode != choice.prefill;
  const DeviceFactory* decoder = other_decoder ? factory_of(choice.decode->kind) : factory;
  if (decoder == nullptr) fail("--decode-device", choice.decode->text() + " names no device");
  if (choice.decode && !choice.decode->is_cpu() && !decoder->decodes()) {
    fail("--decode-device", choice.decode->text() +
                                " reads prompts only: replies are decoded "
                                "on the CPU or a GPU (--decode-device cpu|vulkan)");
  }
  if (other_decoder && factory->decodes_by_default()) {
    fail("--decode-device", "decoding on " + choice.decode->text() + " while prompts run on " +
                                choice.prefill.text() + ": a device that decodes takes both");
  }
  std::optional<bool> decode;
  if (choice.decode) decode = !choice.decode->is_cpu() && !other_decoder;
  OpenedDevice device;
  try {
    device = factory->open(choice.prefill.param, decode, choice.settings);
  } catch (const DeviceSettingError&) {
    throw;
  } catch (const Error& e) {
    out.note = std::string(e.what()) + "; running on the CPU";
    return out;
  }
  out.backends.push_back(device.backend);
  out.prefill = choice.prefill;
  out.decode = device.decodes ? choice.prefill : DeviceName{};
  if (!choice.decode) out.note = device.summary;
  if (other_decoder) {
    try {
      out.backends.push_back(decoder->open(choice.decode->param, true, choice.settings).backend);
      out.decode = *choice.decode;
    } catch (const DeviceSettingError&) {
      throw;
    } catch (const Error& e) {
      out.note = std::string(e.what()) + "; decoding on the CPU";
    }
  }
  return out;
}

WeightMemory weight_memory(const OpenedDevices& devices) {
  WeightMemory total;
  for (const auto& b : devices.backends) {
    const WeightMemory w = b->weight_memory();
    total.in_place_bytes += w.in_place_bytes;
    total.copied_bytes += w.copied_bytes;
    total.host_copied_bytes += w.host_copied_bytes;
  }
  return total;
}

std::string devices_name(const OpenedDevices& devices) {
  std::string name;
  for (const auto& b : devices.backends) name += (name.empty() ? "" : " + ") + b->name();
  return name;
}

std::string describe_weight_memory(const OpenedDevices& devices) {
  std::string out;
  for (const auto& b : devices.backends) {
    const WeightMemory w = b->weight_memory();
    if (w.in_place_bytes + w.copied_bytes == 0) continue;
    char line[160];
    std::snprintf(line, sizeof line,
                  " reads %.1f MB of weights in place from the mapped files, %.1f MB from copies",
                  static_cast<double>(w.in_place_bytes) / 1e6,
                  static_cast<double>(w.copied_bytes) / 1e6);
    out += (out.empty() ? "" : "; ") + b->name().substr(0, b->name().find(' ')) + line;
  }
  return out;
}

}  // namespace qhx
