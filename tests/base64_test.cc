// RFC 4648 base64 both ways (embeddings out, data: URL images in).
#include <gtest/gtest.h>

#include <string>

#include "util/base64.h"

namespace qhx {
namespace {

std::string decoded(std::string_view text) {
  const auto bytes = base64_decode(text);
  if (!bytes) return "<invalid>";
  return std::string(reinterpret_cast<const char*>(bytes->data()), bytes->size());
}

TEST(Base64, RoundTripsEveryLengthAndRefusesWhatIsNotBase64) {
  // RFC 4648 §10's vectors.
  const std::pair<std::string, std::string> vectors[] = {{"", ""},
                                                         {"f", "Zg=="},
                                                         {"fo", "Zm8="},
                                                         {"foo", "Zm9v"},
                                                         {"foob", "Zm9vYg=="},
                                                         {"fooba", "Zm9vYmE="},
                                                         {"foobar", "Zm9vYmFy"}};
  for (const auto& [plain, coded] : vectors) {
    EXPECT_EQ(base64_encode(std::as_bytes(std::span(plain))), coded);
    EXPECT_EQ(decoded(coded), plain);
  }
  EXPECT_EQ(decoded("Zm9v\nYmFy"), "foobar");  // line breaks, as MIME writes them
  for (const char* bad : {"Zm9", "Zg", "Z", "Zm9v!", "Zg==Zg==", "Zm=v", "===="}) {
    EXPECT_EQ(decoded(bad), "<invalid>") << bad;
  }
}

}  // namespace
}  // namespace qhx
