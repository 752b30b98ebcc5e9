// Fuzz target: any bytes as tokenizer.json must load (and then encode, with and without its
// post-processor's special tokens, and decode a fixed text) or give qhx::Error.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include "tokenizer/tokenizer.h"
#include "util/error.h"

namespace {

// A folder of this process's own for the input file, removed when the process exits.
struct ScratchDir {
  std::filesystem::path path =
      std::filesystem::temp_directory_path() / ("qhx-fuzz-tok-" + std::to_string(::getpid()));
  ScratchDir() { std::filesystem::create_directories(path); }
  ~ScratchDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path, ignored);
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const ScratchDir scratch;
  const std::filesystem::path& dir = scratch.path;
  std::ofstream(dir / "tokenizer.json", std::ios::binary | std::ios::trunc)
      .write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  try {
    const qhx::Tokenizer tokenizer = qhx::Tokenizer::load(dir);
    const auto ids = tokenizer.encode("Hello, wörld! 123 <|im_end|>\n");
    tokenizer.decode(ids);
    tokenizer.decode(tokenizer.encode_with_special_tokens("Hello"));
  } catch (const qhx::Error&) {
  }
  return 0;
}
