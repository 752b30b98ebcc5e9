// Fuzz target: any bytes as a prompt. Invalid UTF-8 must give qhx::Error; valid text that is
// already NFC must come back byte for byte from decode(encode(text)).
#include <unicode/normalizer2.h>
#include <unicode/unistr.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "tokenizer/tokenizer.h"
#include "util/error.h"
#include "util/utf8.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const qhx::Tokenizer tokenizer =
      qhx::Tokenizer::load(std::string(QHX_SOURCE_DIR) + "/models/qwen3-tiny-random");
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  std::vector<int32_t> ids;
  try {
    ids = tokenizer.encode(text);
  } catch (const qhx::Error&) {
    if (qhx::find_invalid_utf8(text) == std::string_view::npos) std::abort();  // valid text
    return 0;
  }
  if (qhx::find_invalid_utf8(text) != std::string_view::npos) std::abort();  // accepted bad text
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* nfc = icu::Normalizer2::getNFCInstance(status);
  const bool is_nfc = U_SUCCESS(status) &&
                      nfc->isNormalized(icu::UnicodeString::fromUTF8(text), status) &&
                      U_SUCCESS(status);
  if (is_nfc && tokenizer.decode(ids) != text) {
    std::fprintf(stderr, "round trip changed the text\n");
    std::abort();
  }
  return 0;
}
