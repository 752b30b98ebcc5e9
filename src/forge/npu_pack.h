// qhx forge npu: a base bundle's prompt graphs compiled for the Hexagon NPU of several chips into
// an NPU pack (backend/qnn/npu_pack.h). Per chip: the model runs the prompt plans a session uses
// (a chunk's last-token logits, every token's, with the MTP head's hidden rows when it has one)
// with the chip's backend compiling each run of NPU work into a graph (its matmuls in the pack's
// form, the 16-bit forms over activation ranges measured first on calibration text, on the
// CPU, and recorded in the manifest); the graphs are grouped
// into contexts under the per-context budget, serialized, and their sizes read back from the
// binaries' own fields; then the NPU is compared with the CPU by the gate's measures on probe
// prompts that reach it, and the result recorded per chip with the acceptance (NpuAcceptance) on
// the probes and on a prompt suite, prompts on the NPU and, with decode, replies too (the decode
// graphs packed as well, in contexts of their own). The card
// (forge/npu_card.h) is rendered from the manifest into README.md.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "backend/qnn/npu_pack.h"
#include "forge/npu_calibration.h"
#include "runtime/gate.h"

namespace qhx {

struct NpuPackOptions {
  std::vector<std::string> chips = {"v75", "v81"};  // "v73", ... (hexagon_chips())
  int64_t context_budget_bytes = 0;                 // 0: the backend's default
  std::filesystem::path qnn_lib;                    // empty: where qhx looks by default
  bool overwrite = false;
  // How the matmuls compute (backend/qnn/npu_weights.h). Unset: with calibration, the bundle's
  // weights decide (W8: w8a16, W4: w4a16, else fp16); without, fp16. The 16-bit forms need
  // calibration: text files read by the bundle's tokenizer, and/or token sequences.
  std::optional<NpuForm> form;
  std::vector<std::filesystem::path> calibration_texts;
  std::vector<std::vector<int32_t>> calibration_ids;
  CalibrationOptions calibration;
  // Acceptance, measured per chip into the manifest and card: the check before use's probes
  // always; this suite too when given (its prompts followed greedily for suite_tokens tokens,
  // e.g. tools/train/kjv_prompts.txt's openings, --suite FILE), and with decode both again with
  // the replies decoded on the NPU (--decode-device hexagon, with the pack's decode graphs).
  std::vector<GatePrompt> suite;
  std::string suite_name;
  int64_t suite_tokens = 32;
  // decode: the decode steps' graphs go into the pack too (files of their own, loaded only when
  // the NPU decodes), attention's for every cache length up to decode_context rows (0: the
  // model's max_position_embeddings); and the acceptance is measured with them when checked.
  bool decode = false;
  int64_t decode_context = 0;
  // Publish without comparing the NPU with the CPU (--no-check): the graphs are compiled and not
  // run — layout and size runs on random weights, or models too large to run on the simulator;
  // the manifest says so.
  bool check = true;
};

struct NpuPackChipReport {
  int arch = 0;
  int64_t graphs = 0, contexts = 0, bytes = 0, const_bytes = 0;
  // With decode: the decode graphs packed, their contexts, files' and constants' bytes, and how
  // many graphs a decoding run from the pack still compiled as it measured the acceptance (0:
  // the pack held all it used). The figures above are the prompt graphs'.
  int64_t decode_graphs = 0, decode_contexts = 0, decode_bytes = 0, decode_const_bytes = 0,
          decode_graphs_compiled_at_use = 0;
  NpuForm form = NpuForm::kF16;
  std::string gate;  // the gate's one-line summary
  bool gate_passed = false;
  std::vector<NpuAcceptance> acceptance;
};

// Writes the pack at `out` atomically; Error when the bundle or a chip cannot be compiled, a
// context passes the budget, or the NPU disagrees with the CPU (nothing is written then).
std::vector<NpuPackChipReport> forge_npu_pack(const std::filesystem::path& bundle,
                                              const std::filesystem::path& out,
                                              const NpuPackOptions& options);

}  // namespace qhx
