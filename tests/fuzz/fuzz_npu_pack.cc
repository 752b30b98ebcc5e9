// Fuzz target: any bytes as an NPU pack's MANIFEST.json must parse or give qhx::Error.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "backend/qnn/npu_pack.h"
#include "util/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const qhx::Json manifest =
        qhx::parse_json(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz");
    qhx::parse_npu_pack_manifest(manifest, "MANIFEST.json");
  } catch (const qhx::Error&) {
  }
  return 0;
}
