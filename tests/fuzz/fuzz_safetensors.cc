// Fuzz target: any bytes as a .safetensors file must load or give qhx::Error, never crash.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include "io/safetensors.h"
#include "util/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::filesystem::path path =
      std::filesystem::temp_directory_path() /
      ("qhx-fuzz-" + std::to_string(::getpid()) + ".safetensors");
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      .write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  try {
    const auto file = qhx::SafetensorsFile::open(path);
    volatile uint8_t sink = 0;
    for (const auto& [name, t] : file.tensors()) {
      if (t.nbytes > 0)
        sink = sink ^ static_cast<uint8_t>(t.data[0]) ^ static_cast<uint8_t>(t.data[t.nbytes - 1]);
    }
  } catch (const qhx::Error&) {
  }
  return 0;
}
