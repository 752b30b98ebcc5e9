#include "util/base64.h"

#include <cstdint>

namespace qhx {
namespace {

constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

int value_of(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

}  // namespace

std::string base64_encode(std::span<const std::byte> data) {
  const auto* bytes = reinterpret_cast<const unsigned char*>(data.data());
  const size_t size = data.size();
  std::string out;
  out.reserve((size + 2) / 3 * 4);
  for (size_t i = 0; i < size; i += 3) {
    const uint32_t chunk = (uint32_t{bytes[i]} << 16) |
                           (i + 1 < size ? uint32_t{bytes[i + 1]} << 8 : 0) |
                           (i + 2 < size ? uint32_t{bytes[i + 2]} : 0);
    out += kAlphabet[(chunk >> 18) & 63];
    out += kAlphabet[(chunk >> 12) & 63];
    out += i + 1 < size ? kAlphabet[(chunk >> 6) & 63] : '=';
    out += i + 2 < size ? kAlphabet[chunk & 63] : '=';
  }
  return out;
}

std::optional<std::vector<std::byte>> base64_decode(std::string_view text) {
  std::vector<std::byte> out;
  out.reserve(text.size() / 4 * 3);
  uint32_t chunk = 0;
  int held = 0, padding = 0;
  for (const char c : text) {
    if (c == ' ' || c == '\n' || c == '\r' || c == '\t') continue;
    if (c == '=') {
      ++padding;
      continue;
    }
    const int v = value_of(c);
    if (v < 0 || padding > 0) return std::nullopt;  // not base64, or data after the padding
    chunk = chunk << 6 | static_cast<uint32_t>(v);
    if (++held == 4) {
      out.push_back(static_cast<std::byte>(chunk >> 16));
      out.push_back(static_cast<std::byte>(chunk >> 8));
      out.push_back(static_cast<std::byte>(chunk));
      chunk = 0;
      held = 0;
    }
  }
  if (held == 1 || (held > 0 && held + padding != 4) || (held == 0 && padding != 0)) {
    return std::nullopt;
  }
  if (held == 2) out.push_back(static_cast<std::byte>(chunk >> 4));
  if (held == 3) {
    out.push_back(static_cast<std::byte>(chunk >> 10));
    out.push_back(static_cast<std::byte>(chunk >> 2));
  }
  return out;
}

DataUrl decode_data_url(std::string_view url) {
  if (!url.starts_with("data:")) return {DataUrl::kNotADataUrl, {}};
  const size_t comma = url.find(',');
  if (comma == std::string_view::npos || !url.substr(0, comma).ends_with(";base64")) {
    return {DataUrl::kNotBase64, {}};
  }
  auto bytes = base64_decode(url.substr(comma + 1));
  if (!bytes) return {DataUrl::kBadBase64, {}};
  return {DataUrl::kOk, std::move(*bytes)};
}

}  // namespace qhx
