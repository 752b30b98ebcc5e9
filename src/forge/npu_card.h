// The model card of an NPU pack (README.md beside its MANIFEST.json), rendered from the manifest
// alone: the files per chip with sizes and sha256, what runs where, the memory the graphs need
// while loaded, the QNN build, and the acceptance measured when the pack was made.
#pragma once

#include <filesystem>
#include <string>

#include "backend/qnn/npu_pack.h"

namespace qhx {

// One line: "prompts on the NPU, probes: top-1 0.9932, top-5 0.9950, Pearson r (min) 0.999237,
// KL 7.4e-05; greedy 3/3 identical (8 tokens)".
std::string describe_acceptance(const NpuAcceptance& a);
std::string render_npu_pack_card(const NpuPackManifest& manifest);
// Writes <pack>/README.md from <pack>/MANIFEST.json.
void write_npu_pack_card(const std::filesystem::path& pack);

}  // namespace qhx
