// Packs: bundles of one model for several targets under one MANIFEST.json
// (<pack>/<target>/... per bundle, every file with size and sha256). The runtime picks the most
// capable folder this machine runs, verifies it, and says clearly when none fits.
#pragma once

#include <filesystem>
#include <vector>

namespace qhx {

inline constexpr int64_t kPackFormatVersion = 1;

bool is_pack(const std::filesystem::path& dir);

// The bundle folder of `pack` for this machine, after checking its files' sizes and sha256
// against MANIFEST.json. Throws Error listing the pack's targets when none runs here.
std::filesystem::path select_pack_bundle(const std::filesystem::path& pack);

// Copies `bundles` (one per target) into a new pack at `out`, written atomically.
void write_pack(const std::filesystem::path& out, const std::vector<std::filesystem::path>& bundles,
                bool overwrite);

}  // namespace qhx
