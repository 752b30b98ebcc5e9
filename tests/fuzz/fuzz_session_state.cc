// Fuzz target: any bytes as a session state file (docs/sessions.md) must load into a session of
// a tiny Qwen3.5 fixture (a text one, and one with a vision tower whose states hold images) or
// give qhx::Error, and a failed load leaves the session usable.
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
  static const std::filesystem::path fixtures =
      std::filesystem::path(QHX_SOURCE_DIR) / "tests/fixtures";
  static const auto text = qhx::load_model(fixtures / "qwen3_5/gva2_tied");
  static const auto vision = qhx::load_model(fixtures / "vision/tied_bf16");
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      .write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  for (const qhx::Model* model : {text.get(), vision.get()}) {
    qhx::Session session(*model);
    try {
      session.load(path);
    } catch (const qhx::Error&) {
    }
    // Whatever was loaded (or not) must continue without crashing.
    std::vector<int32_t> tokens(session.tokens().begin(), session.tokens().end());
    tokens.push_back(7);
    qhx::TurnOptions options;
    options.max_new_tokens = 1;
    try {
      session.generate(tokens, options, [](int32_t) { return true; });
    } catch (const qhx::Error&) {
    }
  }
  return 0;
}
