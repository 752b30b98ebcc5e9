#include "util/utf8.h"

#include <cstdint>

namespace qhx {
namespace {

// Expected length of a sequence from its lead byte; 0 for a byte that cannot lead.
size_t sequence_length(uint8_t lead) {
  if (lead < 0x80) return 1;
  if (lead >= 0xC2 && lead <= 0xDF) return 2;
  if (lead >= 0xE0 && lead <= 0xEF) return 3;
  if (lead >= 0xF0 && lead <= 0xF4) return 4;
  return 0;
}

// Whether the second byte is allowed after `lead` (rules out overlongs, surrogates, > U+10FFFF).
bool valid_second_byte(uint8_t lead, uint8_t second) {
  switch (lead) {
    case 0xE0:
      return second >= 0xA0 && second <= 0xBF;
    case 0xED:
      return second >= 0x80 && second <= 0x9F;
    case 0xF0:
      return second >= 0x90 && second <= 0xBF;
    case 0xF4:
      return second >= 0x80 && second <= 0x8F;
    default:
      return (second & 0xC0) == 0x80;
  }
}

}  // namespace

size_t find_invalid_utf8(std::string_view text) {
  const auto* s = reinterpret_cast<const uint8_t*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    const size_t len = sequence_length(s[i]);
    if (len == 0 || i + len > n) return i;
    if (len >= 2 && !valid_second_byte(s[i], s[i + 1])) return i;
    for (size_t k = 2; k < len; ++k) {
      if ((s[i + k] & 0xC0) != 0x80) return i;
    }
    i += len;
  }
  return std::string_view::npos;
}

size_t incomplete_utf8_suffix(std::string_view bytes) {
  const auto* s = reinterpret_cast<const uint8_t*>(bytes.data());
  const size_t n = bytes.size();
  // A sequence is at most 4 bytes, so only the last 3 can be an unfinished start.
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const uint8_t b = s[n - back];
    if ((b & 0xC0) == 0x80) continue;  // continuation byte: keep looking for the lead
    const size_t len = sequence_length(b);
    return (len > back) ? back : 0;
  }
  return 0;
}

}  // namespace qhx
