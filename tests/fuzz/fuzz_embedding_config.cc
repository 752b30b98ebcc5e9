// Fuzz target: any bytes as each of an embedding checkpoint's sentence-transformers files
// (modules.json, 1_Pooling/config.json, config_sentence_transformers.json) and as a bundle
// manifest's "embedding" must be read or give qhx::Error, never crash.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

#include "runtime/embedding.h"
#include "util/error.h"

namespace {

namespace fs = std::filesystem;

constexpr std::string_view kModules =
    R"([{"type": "sentence_transformers.models.Transformer", "path": ""},
        {"type": "sentence_transformers.models.Pooling", "path": "1_Pooling"},
        {"type": "sentence_transformers.models.Normalize", "path": "2_Normalize"}])";
constexpr std::string_view kPooling = R"({"pooling_mode_lasttoken": true})";
constexpr std::string_view kPrompts =
    R"({"prompts": {"query": "Q:"}, "default_prompt_name": null})";

// A folder of this process's own, removed when the process exits.
struct ScratchDir {
  fs::path path = fs::temp_directory_path() / ("qhx-fuzz-emb-" + std::to_string(::getpid()));
  ScratchDir() { fs::create_directories(path / "1_Pooling"); }
  ~ScratchDir() {
    std::error_code ignored;
    fs::remove_all(path, ignored);
  }
};

void write(const fs::path& file, std::string_view text) {
  std::ofstream(file, std::ios::binary | std::ios::trunc)
      .write(text.data(), static_cast<std::streamsize>(text.size()));
}

void read(const fs::path& dir) {
  try {
    const qhx::EmbeddingConfig config = qhx::read_embedding_config(dir);
    for (const auto& [name, text] : config.prompts) config.prompt(name);
    qhx::embedding_json(config).dump();
  } catch (const qhx::Error&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const ScratchDir scratch;
  const fs::path& dir = scratch.path;
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const fs::path files[] = {dir / "modules.json", dir / "1_Pooling" / "config.json",
                            dir / "config_sentence_transformers.json"};
  const std::string_view valid[] = {kModules, kPooling, kPrompts};
  for (int fuzzed = 0; fuzzed < 3; ++fuzzed) {
    for (int i = 0; i < 3; ++i) write(files[i], i == fuzzed ? input : valid[i]);
    read(dir);
  }
  // A bundle: the input as manifest.json's "embedding", and as the whole manifest.
  const fs::path bundle = dir / "bundle";
  fs::create_directories(bundle);
  write(bundle / "manifest.json", "{\"embedding\": " + std::string(input) + "}");
  read(bundle);
  write(bundle / "manifest.json", input);
  read(bundle);
  for (const fs::path& f : files) fs::remove(f);
  return 0;
}
