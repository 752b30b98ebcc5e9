#include "backend/qnn/qnn_library.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "util/error.h"

namespace qhx {
namespace fs = std::filesystem;

const std::vector<HexagonChip>& hexagon_chips() {
  static const std::vector<HexagonChip> chips = {
      {73, 43, "SM8550 (Snapdragon 8 Gen 2)"},
      {75, 57, "SM8650 (Snapdragon 8 Gen 3)"},
      {79, 69, "SM8750 (Snapdragon 8 Elite)"},
      {81, 87, "SM8850 (Snapdragon 8 Elite Gen 5)"},
  };
  return chips;
}

const HexagonChip* hexagon_chip(std::string_view arch) {
  if (arch.starts_with("v")) arch.remove_prefix(1);
  for (const HexagonChip& c : hexagon_chips()) {
    if (arch == std::to_string(c.arch)) return &c;
  }
  return nullptr;
}

namespace {

// The places an installed onnxruntime_qnn package may be.
std::vector<fs::path> package_dirs() {
  std::vector<fs::path> roots;
  if (const char* venv = std::getenv("VIRTUAL_ENV")) roots.push_back(fs::path(venv) / "lib");
  if (const char* home = std::getenv("HOME")) roots.push_back(fs::path(home) / ".local" / "lib");
  roots.push_back("/usr/local/lib");
  roots.push_back("/usr/lib");
  std::vector<fs::path> dirs;
  for (const fs::path& root : roots) {
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(root, ec)) {
      const std::string name = entry.path().filename().string();
      if (!name.starts_with("python3")) continue;
      for (const char* site : {"site-packages", "dist-packages"}) {
        const fs::path dir = entry.path() / site / "onnxruntime_qnn";
        if (fs::exists(dir / "libQnnHtp.so", ec)) dirs.push_back(dir);
      }
    }
  }
  return dirs;
}

fs::path executable_dir() {
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  return ec ? fs::path() : self.parent_path();
}

// dlopen with stdout silenced: the simulator's library prints a line of its own configuration
// there as it loads, which would mix with output a caller parses (--print-ids). It happens
// while a device opens, before anything of qhx's is written.
void* open_quietly(const fs::path& file, std::string* why) {
  // Two loads at once would restore each other's redirection: one at a time.
  static std::mutex stdout_redirection;
  const std::lock_guard lock(stdout_redirection);
  std::fflush(stdout);
  const int saved = dup(STDOUT_FILENO);
  const int null = open("/dev/null", O_WRONLY | O_CLOEXEC);
  if (saved >= 0 && null >= 0) dup2(null, STDOUT_FILENO);
  void* handle = dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (saved >= 0 && null >= 0) {
    std::fflush(stdout);
    dup2(saved, STDOUT_FILENO);
  }
  if (saved >= 0) close(saved);
  if (null >= 0) close(null);
  if (handle == nullptr) {
    const char* error = dlerror();
    *why = error != nullptr ? error : "dlopen failed";
  }
  return handle;
}

std::string version_text(const qnn::Version& v) {
  return std::to_string(v.major) + "." + std::to_string(v.minor) + "." + std::to_string(v.patch);
}

}  // namespace

std::shared_ptr<const QnnLibrary> QnnLibrary::load(const fs::path& dir) {
  std::vector<std::pair<fs::path, std::string>> candidates;  // directory, where it came from
  if (!dir.empty()) {
    candidates.emplace_back(dir, "--qnn-lib");
  } else if (const char* env = std::getenv("QHX_QNN_LIB"); env != nullptr && *env != '\0') {
    candidates.emplace_back(env, "QHX_QNN_LIB");
  } else {
    if (const fs::path here = executable_dir(); !here.empty()) {
      candidates.emplace_back(here, "beside qhx");
    }
    for (const fs::path& d : package_dirs()) candidates.emplace_back(d, "onnxruntime_qnn");
  }
  std::string tried;
  for (const auto& [where, source] : candidates) {
    const fs::path htp_file = where / "libQnnHtp.so";
    std::error_code ec;
    if (!fs::exists(htp_file, ec)) {
      if (source != "beside qhx") tried += "; " + htp_file.string() + ": no such file";
      continue;
    }
    std::shared_ptr<QnnLibrary> lib(new QnnLibrary());
    lib->dir_ = where;
    std::string why;
    lib->htp_library_ = open_quietly(htp_file, &why);
    if (lib->htp_library_ == nullptr) {
      tried += "; " + htp_file.string() + ": " + why;
      continue;
    }
    lib->system_library_ = open_quietly(where / "libQnnSystem.so", &why);
    if (lib->system_library_ == nullptr) {
      tried += "; " + (where / "libQnnSystem.so").string() + ": " + why;
      continue;
    }
    const auto get =
        reinterpret_cast<qnn::GetProviders>(dlsym(lib->htp_library_, qnn::kGetProviders));
    const auto get_system = reinterpret_cast<qnn::GetSystemProviders>(
        dlsym(lib->system_library_, qnn::kGetSystemProviders));
    if (get == nullptr || get_system == nullptr) {
      tried += "; " + where.string() + ": no QNN provider entry point";
      continue;
    }
    const qnn::Interface** providers = nullptr;
    uint32_t count = 0;
    if (get(&providers, &count) != 0 || count == 0) {
      tried += "; " + htp_file.string() + ": it lists no provider";
      continue;
    }
    for (uint32_t i = 0; i < count && lib->htp_ == nullptr; ++i) {
      if (providers[i]->backend_id == qnn::kHtpBackendId) lib->htp_ = providers[i];
    }
    if (lib->htp_ == nullptr) {
      tried += "; " + htp_file.string() + ": no HTP provider";
      continue;
    }
    // The function table's layout qhx declares is core API 2.32's; older ones differ in the middle.
    const qnn::Version core = lib->htp_->api_version.core;
    if (core.major != 2 || core.minor < 32) {
      fail(htp_file.string(), "QNN core API " + version_text(core) +
                                  " is older than the 2.32 qhx calls (QAIRT 2.32 or later)");
    }
    const qnn::SystemInterface** system = nullptr;
    if (get_system(&system, &count) != 0 || count == 0) {
      tried += "; " + where.string() + "/libQnnSystem.so: it lists no provider";
      continue;
    }
    lib->system_ = system[0];
    return lib;
  }
  fail("hexagon",
       "no QNN HTP library (libQnnHtp.so, libQnnSystem.so) found: give --qnn-lib DIR "
       "or QHX_QNN_LIB, or pip install onnxruntime-qnn" +
           tried);
}

QnnLibrary::~QnnLibrary() {
  if (system_library_ != nullptr) dlclose(system_library_);
  if (htp_library_ != nullptr) dlclose(htp_library_);
}

std::string QnnLibrary::build_id() const {
  const char* id = nullptr;
  if (htp_->api.backend_get_build_id(&id) != 0 || id == nullptr) return "unknown";
  return id;
}

bool QnnLibrary::simulator() const {
#if defined(__x86_64__)
  return true;  // Qualcomm ships no x86 NPU: its HTP library there is the simulator
#else
  return false;
#endif
}

const HexagonChip* QnnLibrary::detect_chip(std::string* why) const {
  const qnn::PlatformInfo* info = nullptr;
  if (htp_->api.device_get_platform_info(nullptr, &info) != 0 || info == nullptr) {
    *why = "QNN reports no platform information";
    return nullptr;
  }
  const HexagonChip* found = nullptr;
  *why = "QNN reports no Hexagon device";
  if (info->version == 1 && info->devices != nullptr && info->n_devices <= 64) {
    for (uint32_t d = 0; d < info->n_devices && found == nullptr; ++d) {
      const qnn::HtpDeviceExtension* ext = info->devices[d].extension;
      if (info->devices[d].version != 1 || ext == nullptr) continue;
      for (const HexagonChip& chip : hexagon_chips()) {
        if (chip.soc == ext->soc_model) found = &chip;
      }
      if (found == nullptr) {
        *why = "the device's SoC model " + std::to_string(ext->soc_model) + " (Hexagon v" +
               std::to_string(ext->arch) + ") is not one qhx compiles for";
      }
    }
  }
  htp_->api.device_free_platform_info(nullptr, info);
  return found;
}

std::string QnnLibrary::describe() const {
  const qnn::ApiVersion v = api_version();
  return "QNN " + version_text(v.core) + ", HTP " + version_text(v.backend) + ", build " +
         build_id();
}

std::string QnnLibrary::message(std::string_view what, qnn::ErrorHandle error) const {
  const char* text = nullptr;
  std::string out(what);
  out += ": ";
  if (htp_->api.error_get_message(error, &text) == 0 && text != nullptr && *text != '\0') {
    out += text;
    out += " ";
  }
  out += "(QNN error " + std::to_string(qnn::error_code(error)) + ")";
  return out;
}

void QnnLibrary::check(std::string_view what, qnn::ErrorHandle error) const {
  if (error != 0) throw Error(message(what, error), ErrorKind::kDeviceFailed);
}

HexagonBinaryInfo read_binary_info(const QnnLibrary& library,
                                   std::span<const unsigned char> binary) {
  qnn::Handle context = nullptr;
  library.check("QNN System context", library.system().context_create(&context));
  HexagonBinaryInfo out;
  try {
    // The call takes a writable pointer; it reads the binary.
    std::vector<unsigned char> copy(binary.begin(), binary.end());
    const void* raw = nullptr;
    uint64_t raw_bytes = 0;
    library.check("reading a context binary's description",
                  library.system().context_get_binary_info(context, copy.data(), copy.size(), &raw,
                                                           &raw_bytes));
    const auto* info = static_cast<const qnn::BinaryInfo*>(raw);
    if (info == nullptr || info->version != 3) {
      fail("context binary", "a description of version " +
                                 std::to_string(info != nullptr ? info->version : 0) +
                                 " (qhx reads version 3)");
    }
    const qnn::BinaryInfoV3& v3 = info->v3;
    out.build_id = v3.build_id != nullptr ? v3.build_id : "";
    out.soc_model = v3.soc_model;
    if (v3.metadata != nullptr && v3.metadata_bytes >= sizeof(qnn::HtpContextMetadata)) {
      const auto* meta = static_cast<const qnn::HtpContextMetadata*>(v3.metadata);
      if (meta->version == 1) out.dsp_arch = static_cast<int>(meta->dsp_arch);
    }
    for (uint32_t g = 0; g < v3.n_graphs; ++g) {
      const qnn::GraphInfo& gi = v3.graphs[g];
      HexagonBinaryInfo::Graph graph;
      graph.name = gi.name != nullptr ? gi.name : "";
      const auto describe = [](const qnn::Tensor& t) {
        HexagonBinaryInfo::Tensor d;
        d.id = t.v1.id;
        d.name = t.v1.name != nullptr ? t.v1.name : "";
        d.dims.assign(t.v1.dimensions, t.v1.dimensions + t.v1.rank);
        d.data_type = t.v1.data_type;
        return d;
      };
      for (uint32_t i = 0; i < gi.n_inputs; ++i) graph.inputs.push_back(describe(gi.inputs[i]));
      for (uint32_t i = 0; i < gi.n_outputs; ++i) graph.outputs.push_back(describe(gi.outputs[i]));
      // The HTP's records: version 1, then version 2 right after it.
      const auto* bytes = static_cast<const unsigned char*>(gi.blob_info);
      if (gi.version >= 3 && bytes != nullptr &&
          gi.blob_info_bytes >= sizeof(qnn::HtpGraphRecordV1) + sizeof(qnn::HtpGraphRecordV2)) {
        qnn::HtpGraphRecordV1 r1;
        qnn::HtpGraphRecordV2 r2;
        std::memcpy(&r1, bytes, sizeof r1);
        std::memcpy(&r2, bytes + sizeof r1, sizeof r2);
        if (r1.version == 1) {
          graph.spill_fill_bytes = static_cast<int64_t>(r1.spill_fill_bytes);
          graph.vtcm_bytes = r1.vtcm_bytes;
        }
        if (r2.version == 2) {
          graph.io_bytes = static_cast<int64_t>(r2.io_bytes);
          graph.const_bytes = static_cast<int64_t>(r2.const_bytes);
          graph.shared_weight_bytes = static_cast<int64_t>(r2.shared_weight_bytes);
        }
      }
      out.graphs.push_back(graph);
    }
  } catch (...) {
    library.system().context_free(context);
    throw;
  }
  library.system().context_free(context);
  return out;
}

}  // namespace qhx
