// Fuzz target: any bytes as a bundle's manifest.json must parse or give qhx::Error.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "io/bundle.h"
#include "util/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const qhx::Json manifest =
        qhx::parse_json(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz");
    qhx::parse_bundle_manifest(manifest, "manifest.json");
  } catch (const qhx::Error&) {
  }
  return 0;
}
