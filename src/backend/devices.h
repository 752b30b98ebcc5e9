// Where a model computes, by the names the command line, the server and the C API use: "cpu" or
// a device of a registered kind (backend/device_factory.h): "vulkan" (device 0), "vulkan:N". A
// prompt and its reply may run on different devices: by default, when a device is named, prompt
// chunks run on it and decoding runs where it is faster for a batch of one token (its factory
// says). Builds without a backend accept its names and explain why they run on the CPU.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "backend/device_factory.h"
#include "graph/backend.h"

namespace qhx {

struct DeviceName {
  std::string kind = "cpu";  // "cpu" or a factory's kind
  std::string param;         // what follows ':' in the canonical name ("0" in "vulkan:0")
  std::string text() const;  // "cpu", "vulkan:0"
  bool is_cpu() const { return kind == "cpu"; }
  bool operator==(const DeviceName&) const = default;
};

// The device factories, in the order `qhx devices` lists them.
std::span<const DeviceFactory* const> device_factories();

// Error naming `option` when `text` names no device.
DeviceName parse_device_name(std::string_view text, std::string_view option);

// One line per device this build can use ("vulkan:0  llvmpipe ... · CPU · ..."), and per kind
// with none here, why ("hexagon   none: no QNN HTP library ...").
std::vector<std::string> describe_devices();

struct DeviceChoice {
  DeviceName prefill;                // where prompt chunks run
  std::optional<DeviceName> decode;  // where single-token steps run; unset: the default
  DeviceSettings settings;           // for the device's factory ("qnn_lib": a folder)
};

struct OpenedDevices {
  std::vector<std::shared_ptr<Backend>> backends;  // for LoadOptions::devices
  DeviceName prefill, decode;                      // where each runs now
  // One line for the user when the choice changed (no device: the CPU) or was made for them
  // (where decoding runs); empty otherwise.
  std::string note;
};

// Opens what `choice` names: the prompt's device, and another that decodes when the choice names
// one (an NPU reading prompts, a GPU decoding). A device that cannot be opened is a note and the
// CPU, never an error; contradictory names (decoding on a device that decodes nothing) are an
// Error.
OpenedDevices open_devices(const DeviceChoice& choice);

// "vulkan:0 reads 37.9 MB of weights in place from the mapped files, 0.0 MB from copies": where
// the devices' weights are, once a model prepared them; empty without a device holding any.
std::string describe_weight_memory(const OpenedDevices& devices);
// What the devices' weights take, summed over them.
WeightMemory weight_memory(const OpenedDevices& devices);
// The devices' names joined by " + " (a prompt device and another decoding), "" without any.
std::string devices_name(const OpenedDevices& devices);

}  // namespace qhx
