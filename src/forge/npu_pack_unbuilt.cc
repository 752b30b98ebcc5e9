// Builds without the Hexagon backend (QHX_HEXAGON=OFF): qhx forge npu says why it cannot run.
#include "forge/npu_pack.h"
#include "util/error.h"

namespace qhx {

std::vector<NpuPackChipReport> forge_npu_pack(const std::filesystem::path&,
                                              const std::filesystem::path&, const NpuPackOptions&) {
  fail("forge npu", "qhx was built without the Hexagon backend (QHX_HEXAGON=OFF)");
}

}  // namespace qhx
