// Fuzz target: any bytes as config.json / generation_config.json must parse or give
// qhx::Error, never crash.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include "io/hf_config.h"
#include "runtime/generation_config.h"
#include "util/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::filesystem::path path =
      std::filesystem::temp_directory_path() / ("qhx-fuzz-" + std::to_string(::getpid()) + ".json");
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      .write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  try {
    qhx::load_model_config(path);
  } catch (const qhx::Error&) {
  }
  try {
    qhx::parse_generation_config(qhx::read_json_file(path), path.string(), qhx::ModelConfig{});
  } catch (const qhx::Error&) {
  }
  return 0;
}
