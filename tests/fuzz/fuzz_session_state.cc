// Fuzz target: any bytes as a session state file (docs/sessions.md) must load into a session of
// a tiny Qwen3.5 fixture or give qhx::Error, and a failed load leaves the session usable.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include "models/model.h"
#include "runtime/session.h"
#include "util/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::filesystem::path path =
      std::filesystem::temp_directory_path() / ("qhx-fuzz-" + std::to_string(::getpid()) + ".qhxs");
  static const auto model = qhx::load_model(std::filesystem::path(QHX_SOURCE_DIR) / "tests" /
                                            "fixtures" / "qwen3_5" / "gva2_tied");
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      .write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  qhx::Session session(*model);
  try {
    session.load(path);
  } catch (const qhx::Error&) {
  }
  // Whatever was loaded (or not) must continue without crashing.
  const int32_t next = 7;
  std::vector<int32_t> tokens(session.tokens().begin(), session.tokens().end());
  tokens.push_back(next);
  qhx::TurnOptions options;
  options.max_new_tokens = 1;
  try {
    session.generate(tokens, options, [](int32_t) { return true; });
  } catch (const qhx::Error&) {
  }
  return 0;
}
