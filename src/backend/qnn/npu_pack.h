// NPU packs: the Hexagon graphs of one base bundle compiled ahead of time, once per chip, as QNN
// context binaries (qhx forge npu makes them; docs/bundle.md documents the layout):
//
//   <pack>/MANIFEST.json      format "qhx-npu-pack": the base bundle it pairs with (the sha256 of
//                             its manifest.json, which lists every file's), the QNN build, and
//                             per chip every file with its size, sha256 and graphs
//   <pack>/v75/context_0.bin  one or more contexts per chip, each under the context budget
//   <pack>/v75/decode_0.bin   the decode steps' graphs (forge npu --decode), loaded only when the
//                             NPU decodes
//   <pack>/v81/...
//
// A pack carries no embeddings; unless it holds decode graphs, no lm-head either: the reply
// comes from the base model, which the CPU decodes. A run picks its chip's folder only, checks the
// sha256 of what it loads, and refuses in one line a pack for another base, an absent chip, a
// tampered binary.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "backend/qnn/npu_weights.h"
#include "util/json_file.h"

namespace qhx {

// 2: graphs name their norm vectors by weight id (1: by their bytes). 3: files may hold decode
// graphs (a qhx reading 2 would load them as prompt graphs); 2 is read as 3 without them.
inline constexpr int64_t kNpuPackFormatVersion = 3;
inline constexpr int64_t kNpuPackOldestFormatVersion = 2;

// One graph of a context binary: its name there, what it computes (the backend's key), and which
// of the run's values its inputs and outputs are (in the order of first use within the run).
struct NpuPackGraph {
  std::string name, key;
  std::vector<size_t> inputs, outputs;
  int64_t const_bytes = 0, io_bytes = 0, spill_fill_bytes = 0;  // from the binary's own fields
};

struct NpuPackFile {
  std::string path;  // relative to the pack
  std::string sha256;
  int64_t bytes = 0;
  // Its graphs are a decode step's (one row, the lm-head, the state ops' and attention's per
  // cache length): loaded only when the NPU decodes (--decode-device hexagon).
  bool decode = false;
  std::vector<NpuPackGraph> graphs;
};

// How the NPU compared with the CPU (the base bundle alone) on one suite of prompts when the
// pack was made: the gate's measures (runtime/gate.h) over teacher-forced positions, and greedy
// continuations followed token by token — what a user reads before shipping the pack.
struct NpuAcceptance {
  bool replies = false;  // the replies were decoded on the NPU too (--decode-device hexagon)
  std::string suite;     // "probes" (the check before use's) or the prompt file's name
  int64_t prompts = 0, greedy_tokens = 0, greedy_identical = 0;
  double top1 = 0, top5 = 0, pearson_min = 0, kl_mean = 0;  // NaN: not finite when measured
  std::vector<int64_t> first_divergence;  // per prompt: the first differing token, -1 if none
  bool passed = false;                    // within the check before use's thresholds (docs/gate.md)
};

struct NpuPackChip {
  int arch = 0;
  uint32_t soc = 0;
  std::vector<NpuPackFile> files;
  std::string gate;  // how the NPU compared with the CPU when the pack was made (one line)
  std::vector<NpuAcceptance> acceptance;
  int64_t bytes() const;
};

struct NpuPackManifest {
  std::string base_name;             // the base bundle's folder name, for messages
  std::string base_manifest_sha256;  // what pairs the pack with its base
  std::string qnn_build;             // the QNN build that compiled it
  NpuForm form = NpuForm::kF16;      // "precision": how its matmuls compute
  // The 16-bit forms' activation ranges (by weight id) and how many tokens of calibration text
  // measured them (forge npu --calibrate); empty in fp16.
  ActivationRanges ranges;
  int64_t calibration_tokens = 0;
  int64_t chunk_rows = 0;
  int64_t context_budget_bytes = 0;
  std::vector<NpuPackChip> chips;
};

bool is_npu_pack(const std::filesystem::path& dir);
// Reads and checks the manifest (Error naming MANIFEST.json and the field).
NpuPackManifest read_npu_pack(const std::filesystem::path& dir);
// The same from its parsed JSON; `where` names it in errors.
NpuPackManifest parse_npu_pack_manifest(const Json& manifest, const std::string& where);
void write_npu_pack_manifest(const std::filesystem::path& dir, const NpuPackManifest& manifest);
// The sha256 of a bundle's manifest.json: what a pack records of its base.
std::string npu_pack_base_id(const std::filesystem::path& bundle);

// A context of a chip as it loads: its binary, read whole and checked against the manifest.
struct NpuPackContext {
  std::vector<unsigned char> binary;
  std::vector<NpuPackGraph> graphs;
  bool decode = false;  // a decode step's graphs (NpuPackFile::decode)
  // Made with weight sharing (a decoding backend's): the simulator cannot load such a binary
  // again (HexagonContext), so no pack holds one.
  bool shares_weights = false;
};
// The contexts of chip `arch` in `pack`, for the base bundle `base`: the prompt graphs', and the
// decode graphs' too when `decode`. Error (one line) when the pack was made from another base,
// has no folder for this chip, or a file differs from the manifest (missing, resized, tampered).
std::vector<NpuPackContext> load_npu_pack_chip(const std::filesystem::path& pack,
                                               const std::filesystem::path& base, int arch,
                                               bool decode = false);
// Checks every file of every chip against the manifest (qhx verify); returns the files checked.
int64_t verify_npu_pack(const std::filesystem::path& pack);

}  // namespace qhx
