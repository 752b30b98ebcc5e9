// A kind of device qhx can compute on ("vulkan", "hexagon"): how its names read, what of it is
// there, and opening one as a Backend. backend/devices.h enumerates the factories at run time and
// chooses among them by name; each backend's own switches (test faults, portable shaders) are read
// by its factory, not by the code that chooses. A build without a backend still has its factory,
// which explains why it has none (unbuilt_device_factory).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "graph/backend.h"
#include "util/error.h"

namespace qhx {

// Named settings a factory reads as it opens a device ("qnn_lib" → a folder): what a command
// line or the C API passes to one kind of device without the others knowing of it.
using DeviceSettings = std::map<std::string, std::string>;

// What a factory throws when a setting names something wrong (a pack made for another model):
// an error of the caller's, not the device's, so the model does not quietly run on the CPU.
class DeviceSettingError : public Error {
 public:
  using Error::Error;
};

// A device opened for a model.
struct OpenedDevice {
  std::shared_ptr<Backend> backend;
  bool decodes = false;  // whether single-token steps run on it (else on the CPU)
  // "vulkan:0 (llvmpipe ...) reads prompts; the CPU decodes (...)": said to the user when the
  // choice of where decoding runs was made for them.
  std::string summary;
};

class DeviceFactory {
 public:
  virtual ~DeviceFactory() = default;
  // The kind, the part of a device name before ':' ("vulkan").
  virtual std::string_view kind() const = 0;
  // How its names read, for errors and help ("vulkan or vulkan:N").
  virtual std::string_view forms() const = 0;
  // The canonical name of kind[:param] ("vulkan" → "vulkan:0"); Error naming `option` when
  // `param` names none.
  virtual std::string canonical(std::string_view param, std::string_view option) const = 0;
  // Whether its devices can decode (single-token steps).
  virtual bool decodes() const { return true; }
  // Whether a device of this kind decodes unless told not to (a GPU, where it is faster): then
  // it keeps the replies of the prompts it reads, and another decoding device is refused. An NPU
  // reads prompts and leaves replies to the CPU, or to a GPU, unless it is told to decode.
  virtual bool decodes_by_default() const { return decodes(); }
  // One line per device of this kind that is there ("vulkan:0  llvmpipe ..."); none, with `why`
  // saying why, when there is none.
  virtual std::vector<std::string> describe(std::string* why) const = 0;
  // Opens the device a canonical name's `param` names. `decode`: whether single-token steps run
  // on it too (unset: where it is faster, the factory's call). A device that cannot be opened is
  // an Error saying why; the caller runs on the CPU.
  virtual OpenedDevice open(std::string_view param, std::optional<bool> decode,
                            const DeviceSettings& settings) const = 0;

  // The op suite (tests/backend_ops_test.cc) runs every op on each of these backends against its
  // ref:: definition: the first device of this kind as it opens, and variants that take its other
  // paths (a constrained phone-like device, say), each made fresh by `make`. None, with `why`,
  // when no device of this kind is there: the suite then skips it, or fails when the environment
  // sets required_switch() (CI sets QHX_REQUIRE_VULKAN).
  struct SuiteVariant {
    std::string name;
    std::function<std::shared_ptr<Backend>()> make;
    bool matmuls_only = false;  // a variant only the matmul cases exercise
    // Whether it runs every op kind at every row count (else: the cases whose nodes it
    // supports), the rows its cases take (empty: the suite's own, 1 and 5, matmuls 70), and its
    // tolerance, relative to the largest reference value (fp16 arithmetic needs more).
    bool every_op = true;
    std::vector<int64_t> rows = {};
    float tolerance = 1e-4f;
  };
  virtual std::vector<SuiteVariant> op_suite_variants(std::string* why) const = 0;
  virtual std::string_view required_switch() const = 0;
};

// A factory of a kind this build does not have: it accepts the names and says why it cannot
// open them.
std::unique_ptr<DeviceFactory> unbuilt_device_factory(std::string kind, std::string forms,
                                                      std::string why);

// Each backend's factory (the unbuilt one when the build leaves it out: src/CMakeLists.txt picks
// the source).
std::unique_ptr<DeviceFactory> make_vulkan_factory();
std::unique_ptr<DeviceFactory> make_hexagon_factory();

}  // namespace qhx
