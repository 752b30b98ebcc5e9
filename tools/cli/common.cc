#include "common.h"

#include <sys/resource.h>
#include <algorithm>

#include <cstdint>
#include <cstdio>
#include <exception>
#include <sstream>

#include "io/bundle.h"
#include "kernels/cpu_context.h"
#include "kernels/thread_pool.h"
#include "models/model.h"
#include "runtime/device_check.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"

namespace qhx::cli {

double peak_rss_mb() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;  // ru_maxrss is in KiB on Linux
}

std::vector<int32_t> parse_id_list(const std::string& text, const std::string& flag) {
  std::vector<int32_t> ids;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    size_t used = 0;
    long long value = 0;
    try {
      value = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != item.size() || value < 0 || value > INT32_MAX) {
      qhx::fail(flag, "'" + item + "' is not a non-negative integer");
    }
    ids.push_back(static_cast<int32_t>(value));
  }
  if (ids.empty()) qhx::fail(flag, "no values given");
  return ids;
}

int default_threads() {
  return qhx::hardware_threads();
}

std::shared_ptr<qhx::CpuContext> cpu_context(int threads) {
  return std::make_shared<qhx::CpuContext>(threads, qhx::CpuKernels::from_environment());
}

void print_model_note(const qhx_model_info& info, const char* prefix) {
  if (*info.model_note != '\0') std::fprintf(stderr, "%snote: %s\n", prefix, info.model_note);
}

qhx::OpenedDevices open_devices(const DeviceArgs& args, const std::filesystem::path& model_dir) {
  qhx::DeviceChoice choice;
  choice.prefill = qhx::parse_device_name(args.device, "--device");
  if (!args.decode_device.empty()) {
    choice.decode = qhx::parse_device_name(args.decode_device, "--decode-device");
  }
  if (!args.qnn_lib.empty()) choice.settings["qnn_lib"] = args.qnn_lib;
  if (!args.npu_pack.empty()) {
    if (choice.prefill.kind != "hexagon") {
      qhx::fail("--npu-pack", "an NPU pack needs the NPU as the device (--device hexagon:vNN)");
    }
    choice.settings["npu_pack"] = args.npu_pack;
  }
  if (args.profile) choice.settings.emplace("profile", "on");
  choice.settings["model"] = model_dir.string();
  qhx::OpenedDevices opened = qhx::open_devices(choice);
  if (!opened.note.empty()) std::fprintf(stderr, "qhx: %s\n", opened.note.c_str());
  return opened;
}

bool check_devices(qhx::Model& model, const qhx::OpenedDevices& devices, const DeviceArgs& args,
                   const std::filesystem::path& model_dir) {
  if (!model.has_devices()) return true;
  qhx::DeviceCheckOptions options;
  options.mode = *qhx::parse_device_check_mode(args.device_check);  // checked by the parser
  options.cache_dir = qhx::default_cache_dir();
  std::optional<qhx::Tokenizer> tokenizer;
  if (std::filesystem::exists(model_dir / "tokenizer.json")) {
    tokenizer = qhx::Tokenizer::load(model_dir);
  }
  options.weights = qhx::check_weights_for(model_dir, devices.backends);
  const qhx::DeviceCheckResult r = qhx::check_devices(model, qhx::devices_name(devices),
                                                      tokenizer ? &*tokenizer : nullptr, options);
  if (!r.summary.empty()) std::fprintf(stderr, "qhx: %s\n", r.summary.c_str());
  if (r.passed) {
    const std::string weights = qhx::describe_weight_memory(devices);
    if (!weights.empty()) std::fprintf(stderr, "qhx: %s\n", weights.c_str());
  }
  return r.passed;
}

std::string describe_bundle(const qhx::BundleManifest& m) {
  std::string line = "bundle: " + m.family + ", weights " +
                     m.precision_policy.value("matrices", std::string("?")) + ", target " +
                     m.target + ", " + std::to_string(m.shards.size()) + " decoder shard(s); ";
  if (m.gate.is_null()) return line + "not gated";
  char buf[200];
  std::snprintf(buf, sizeof buf, "gate %s: top-1 %.4f, Pearson r %.6f, KL %.3g, greedy %lld/%lld",
                m.gate.value("passed", false) ? "passed" : "FAILED", m.gate.value("top1", 0.0),
                m.gate.value("pearson_min", 0.0), m.gate.value("kl_mean", 0.0),
                m.gate.value("greedy_matched", 0LL), m.gate.value("prompts", 0LL));
  return line + buf;
}

}  // namespace qhx::cli
