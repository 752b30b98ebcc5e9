// Qualcomm's QNN libraries (libQnnHtp.so and libQnnSystem.so), opened with dlopen at run time:
// qhx has no link-time dependency on them, and a build or a machine without them works as
// before. On x86_64 (PyPI's onnxruntime-qnn wheel ships them) the HTP library compiles graphs
// for a chosen Hexagon arch and runs them in Qualcomm's simulator; on a phone it drives the NPU.
#pragma once

#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/qnn/qnn_abi.h"

namespace qhx {

// A Hexagon generation qhx compiles for, and the Snapdragon it names (the SoC decides the arch
// and whether graphs compute in fp16).
struct HexagonChip {
  int arch;          // 73, 75, 79, 81
  uint32_t soc;      // QNN's SoC model id
  const char* name;  // "SM8650 (Snapdragon 8 Gen 3)"
};
const std::vector<HexagonChip>& hexagon_chips();
// The chip of "v75" / "75"; null when qhx knows none.
const HexagonChip* hexagon_chip(std::string_view arch);

class QnnLibrary {
 public:
  // Where it looks, in order: `dir` if given, else $QHX_QNN_LIB, else beside the executable, else
  // an installed onnxruntime_qnn package ($VIRTUAL_ENV, then ~/.local and the system's
  // site-packages). Error (one line, naming where it looked and why each failed) when none
  // loads, or the provider is not QNN 2.32+ HTP.
  static std::shared_ptr<const QnnLibrary> load(const std::filesystem::path& dir = {});
  ~QnnLibrary();
  QnnLibrary(const QnnLibrary&) = delete;
  QnnLibrary& operator=(const QnnLibrary&) = delete;

  const qnn::FunctionTable& api() const { return htp_->api; }
  const qnn::SystemFunctionTable& system() const { return system_->api; }
  const std::filesystem::path& dir() const { return dir_; }
  qnn::ApiVersion api_version() const { return htp_->api_version; }
  std::string build_id() const;  // "v2.51.0.260929181845"
  // "QNN 2.40.0, HTP 5.51.0, build v2.51.0..."
  std::string describe() const;
  // Whether this library simulates the NPU on the host (x86) rather than driving one.
  bool simulator() const;
  // The chip of the NPU this process runs beside, from the device's platform information; null
  // where there is none (the simulator reports no hardware device) or it is no chip qhx knows
  // (`why` says which SoC and arch it reported).
  const HexagonChip* detect_chip(std::string* why) const;
  // "graph create: QNN_GRAPH_ERROR_...: ... (6003)", for an error `what` returned.
  std::string message(std::string_view what, qnn::ErrorHandle error) const;
  // Error kDeviceFailed with message() unless `error` is success.
  void check(std::string_view what, qnn::ErrorHandle error) const;

 private:
  QnnLibrary() = default;
  void* htp_library_ = nullptr;
  void* system_library_ = nullptr;
  const qnn::Interface* htp_ = nullptr;
  const qnn::SystemInterface* system_ = nullptr;
  std::filesystem::path dir_;
};

// A compiled context binary's description, read through QNN System without loading it.
struct HexagonBinaryInfo {
  std::string build_id;
  int dsp_arch = 0;
  uint32_t soc_model = 0;
  struct Tensor {
    uint32_t id = 0;
    std::string name;
    std::vector<uint32_t> dims;
    uint32_t data_type = 0;
  };
  struct Graph {
    std::string name;
    std::vector<Tensor> inputs, outputs;
    int64_t spill_fill_bytes = 0, vtcm_bytes = 0, io_bytes = 0, const_bytes = 0,
            shared_weight_bytes = 0;
  };
  std::vector<Graph> graphs;
};
HexagonBinaryInfo read_binary_info(const QnnLibrary& library,
                                   std::span<const unsigned char> binary);

}  // namespace qhx
