// Helpers more than one qhx command uses: option parsing, the thread default, the compute context,
// a bundle's provenance line. Those of one command stay in its file.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "backend/devices.h"
#include "io/hf_config.h"
#include "qhx/qhx.h"

namespace qhx {
class CpuContext;
class Model;
struct BundleManifest;
}  // namespace qhx

namespace qhx::cli {

// A model and a session of the C API, closed when it goes out of scope.
struct OpenedModel {
  qhx_model* model = nullptr;
  qhx_session* session = nullptr;
  OpenedModel() = default;
  OpenedModel(const OpenedModel&) = delete;
  OpenedModel& operator=(const OpenedModel&) = delete;
  ~OpenedModel() {
    qhx_session_destroy(session);
    qhx_model_close(model);
  }
};

// The process's peak resident memory so far, in MB.
double peak_rss_mb();

// Comma-separated non-negative 32-bit integers; errors name `flag`.
std::vector<int32_t> parse_id_list(const std::string& text, const std::string& flag);

// -t / --threads for the commands that run a model: default, every hardware thread.
int default_threads();

// The context a command's model computes on: -t threads, the kernels QHX_KERNELS allows.
std::shared_ptr<qhx::CpuContext> cpu_context(int threads);

// --device and --decode-device of the commands that run a model.
struct DeviceArgs {
  std::string device = "cpu";
  std::string decode_device;  // empty: the device's default
  std::string device_check = "once";
  std::string qnn_lib;          // empty: QNN's libraries where qhx looks by default
  std::string npu_pack;         // empty: none (graphs compile on first use)
  bool profile = false;         // the device times its work (qhx bench --profile)
  std::string kv_type = "f32";  // --kv-type: LoadOptions::kv_type, qhx_model_options.kv_type
  const char* decode_or_null() const {
    return decode_device.empty() ? nullptr : decode_device.c_str();
  }
};

// --speculative none|ngram|draft:<dir> and --draft-max of the commands that generate.
struct SpeculativeArgs {
  std::string value = "none";
  int draft_max = 4;
  int64_t mtp_vocab = 0;  // LoadOptions::mtp_vocab_size: 0 the whole draft_vocab.json, -1 none
  bool on() const { return value != "none"; }
  // The C API's qhx_generate_options.speculative: "none", "ngram" or "draft".
  const char* kind() const { return draft_model() != nullptr ? "draft" : value.c_str(); }
  // draft:<dir>'s directory (qhx_model_options.draft_model), else nullptr.
  const char* draft_model() const {
    return value.rfind("draft:", 0) == 0 ? value.c_str() + 6 : nullptr;
  }
};

// The model's note (what of the checkpoint it leaves unused and why, qhx_model_info.model_note)
// on stderr after `prefix`, if it has one.
void print_model_note(const qhx_model_info& info, const char* prefix);

// The backends they name (backend/devices.h), for commands that load a model themselves; the
// note, if any, goes to stderr.
qhx::OpenedDevices open_devices(const DeviceArgs& args, const std::filesystem::path& model_dir);
// The device check before use (runtime/device_check.h) for those commands; its line goes to
// stderr. Whether the devices run the model now (false: they failed it, the CPU runs it all).
bool check_devices(qhx::Model& model, const qhx::OpenedDevices& devices, const DeviceArgs& args,
                   const std::filesystem::path& model_dir);

// One line for stderr about a bundle's provenance: its plan and its gate certificate.
std::string describe_bundle(const qhx::BundleManifest& m);

}  // namespace qhx::cli
