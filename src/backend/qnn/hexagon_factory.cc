// The Hexagon NPU (backend/device_factory.h): "hexagon" or "hexagon:v73|v75|v79|v81", through the
// QNN libraries found at run time (backend/qnn/qnn_library.h). On x86 the library is Qualcomm's
// simulator, and "hexagon" alone simulates the newest chip qhx knows.
#include <algorithm>
#include <cstdlib>
#include <filesystem>

#include "backend/device_factory.h"
#include "backend/qnn/hexagon_backend.h"
#include "util/error.h"
#include "util/sha256.h"

namespace qhx {
namespace fs = std::filesystem;
namespace {

std::string chip_forms() {
  std::string forms = "hexagon or hexagon:";
  for (const HexagonChip& c : hexagon_chips()) {
    forms += 'v';
    forms += std::to_string(c.arch);
    if (&c != &hexagon_chips().back()) forms += '|';
  }
  return forms;
}

HexagonBackendOptions options_from_environment() {
  HexagonBackendOptions options;
  if (const char* n = std::getenv("QHX_HEXAGON_FAIL_EXECUTION")) {
    options.fail_execution = std::atoll(n);
  }
  if (const char* op = std::getenv("QHX_HEXAGON_PERTURB")) options.perturb_op = op;
  return options;
}

class HexagonFactory final : public DeviceFactory {
 public:
  HexagonFactory() : forms_(chip_forms()) {}
  std::string_view kind() const override { return "hexagon"; }
  std::string_view forms() const override { return forms_; }
  bool decodes_by_default() const override { return false; }  // --decode-device hexagon

  // "hexagon" alone is the chip the device reports (the simulator: the newest qhx knows).
  std::string canonical(std::string_view param, std::string_view option) const override {
    if (param.empty()) return "hexagon";
    const HexagonChip* chip = hexagon_chip(param);
    if (chip == nullptr) {
      std::string message = "hexagon:";
      message += param;
      message += " names no chip qhx compiles for (" + forms_ + ")";
      fail(option, message);
    }
    return "hexagon:v" + std::to_string(chip->arch);
  }

  std::vector<std::string> describe(std::string* why) const override {
    std::shared_ptr<const QnnLibrary> library;
    try {
      library = QnnLibrary::load();
    } catch (const Error& e) {
      if (why != nullptr) *why = e.what();
      return {};
    }
    std::string chips;
    for (const HexagonChip& c : hexagon_chips()) {
      chips += (chips.empty() ? "v" : "|v") + std::to_string(c.arch);
    }
    return {"hexagon:" + chips + "  " +
            (library->simulator() ? "Qualcomm's HTP simulator (functional, not a phone's speed)"
                                  : "Hexagon NPU") +
            " · " + library->describe() + " · " + library->dir().string()};
  }

  OpenedDevice open(std::string_view param, std::optional<bool> decode,
                    const DeviceSettings& settings) const override {
    const auto lib = settings.find("qnn_lib");
    const auto library = QnnLibrary::load(lib != settings.end() ? lib->second : std::string());
    const HexagonChip* chip = hexagon_chip(param);
    if (param.empty()) {
      std::string why;
      chip = library->simulator() ? &hexagon_chips().back() : library->detect_chip(&why);
      if (chip == nullptr) fail("hexagon", why + ": name the chip (" + forms_ + ")");
    }
    if (chip == nullptr) fail("hexagon", "no chip " + std::string(param));
    // A pack's graphs for this chip, checked against its manifest and its base: a pack that
    // does not fit is the caller's error.
    std::vector<NpuPackContext> pack;
    std::string pack_note;
    HexagonBackendOptions options = options_from_environment();
    options.decode = decode.value_or(false);
    if (const auto p = settings.find("npu_pack"); p != settings.end() && !p->second.empty()) {
      const auto model = settings.find("model");
      try {
        if (model == settings.end()) fail("npu_pack", "no base model to pair the pack with");
        const NpuPackManifest m = read_npu_pack(p->second);
        const std::string where = p->second + "/MANIFEST.json";
        if (m.chunk_rows != HexagonBackend::kChunkRows) {
          fail(where, "graphs of " + std::to_string(m.chunk_rows) +
                          " rows: this qhx runs 128-row graphs (make the pack again)");
        }
        options.form = m.form;
        options.ranges = m.ranges;
        const bool has_binaries = std::any_of(m.chips.begin(), m.chips.end(), [&](const auto& c) {
          return c.arch == chip->arch && !c.files.empty();
        });
        if (has_binaries && m.qnn_build != library->build_id()) {
          fail(where, "compiled by QNN " + m.qnn_build + ", this library is " +
                          library->build_id() + " (make the pack with it, or give --qnn-lib)");
        }
        pack = load_npu_pack_chip(p->second, model->second, chip->arch, options.decode);
      } catch (const Error& e) {
        throw DeviceSettingError(e.what());
      }
      int64_t bytes = 0;
      for (const NpuPackContext& c : pack) bytes += static_cast<int64_t>(c.binary.size());
      pack_note = pack.empty() ? " compiled on first use from the pack's ranges, " +
                                     std::string(npu_form_name(options.form))
                               : " from the pack's " + std::to_string(pack.size()) +
                                     " context(s), " + std::to_string(bytes / 1000000) + " MB, " +
                                     std::string(npu_form_name(options.form));
      options.pack_id = sha256_file(fs::path(p->second) / "MANIFEST.json").substr(0, 12);
    }
    const bool packed_decode =
        std::any_of(pack.begin(), pack.end(), [](const NpuPackContext& c) { return c.decode; });
    const auto device = HexagonDevice::open(library, *chip);
    OpenedDevice out;
    if (pack.empty()) {
      out.backend = std::make_shared<HexagonBackend>(device, options);
    } else {
      try {  // a binary that does not load, or does not match its manifest: the pack's fault
        out.backend = std::make_shared<HexagonBackend>(device, options, std::move(pack));
      } catch (const Error& e) {
        throw DeviceSettingError(settings.at("npu_pack") + ": " + e.what());
      }
    }
    out.decodes = options.decode;
    out.summary = device->describe() + " reads prompts in chunks of " +
                  std::to_string(HexagonBackend::kChunkRows) + " tokens" + pack_note +
                  (!options.decode ? "; the CPU decodes"
                   : packed_decode ? "; it decodes too, with the pack's decode graphs"
                                   : "; it decodes too, its decode graphs compiled at load");
    return out;
  }

  std::vector<SuiteVariant> op_suite_variants(std::string* why) const override {
    std::shared_ptr<const QnnLibrary> library;
    try {
      library = QnnLibrary::load();
    } catch (const Error& e) {
      *why = e.what();
      return {};
    }
    std::vector<SuiteVariant> out;
    for (const int arch : {75, 81}) {
      const HexagonChip& chip = *hexagon_chip(std::to_string(arch));
      SuiteVariant v;
      v.name = "hexagon:v" + std::to_string(arch) + " (" + library->describe() + ")";
      v.make = [library, chip] {
        return std::make_shared<HexagonBackend>(HexagonDevice::open(library, chip));
      };
      // The row-wise ops, on whole chunks (one and two), in the HTP's fp16.
      v.every_op = false;
      v.rows = {HexagonBackend::kChunkRows, 2 * HexagonBackend::kChunkRows};
      v.tolerance = 1e-2f;
      out.push_back(std::move(v));
    }
    // A decode step's ops, one row: the row-wise ones, RoPE, attention over a cache.
    SuiteVariant step;
    step.name = "hexagon:v81 decoding (" + library->describe() + ")";
    step.make = [library] {
      HexagonBackendOptions options;
      options.decode = true;
      return std::make_shared<HexagonBackend>(HexagonDevice::open(library, *hexagon_chip("81")),
                                              options);
    };
    step.every_op = false;
    step.rows = {1};
    step.tolerance = 1e-2f;
    out.push_back(std::move(step));
    return out;
  }
  std::string_view required_switch() const override { return "QHX_REQUIRE_HEXAGON"; }

 private:
  std::string forms_;
};

}  // namespace

std::unique_ptr<DeviceFactory> make_hexagon_factory() {
  return std::make_unique<HexagonFactory>();
}

}  // namespace qhx
