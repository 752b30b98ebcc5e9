// Fuzz target: any bytes as draft_vocab.json must parse into valid ids or give qhx::Error, never
// crash.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "io/draft_vocab.h"
#include "util/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  constexpr int64_t kVocab = 1000;
  try {
    const std::string_view text(reinterpret_cast<const char*>(data), size);
    for (const int32_t id : qhx::parse_draft_vocab(text, "draft_vocab.json", kVocab)) {
      if (id < 0 || id >= kVocab) std::abort();
    }
  } catch (const qhx::Error&) {
  }
  return 0;
}
