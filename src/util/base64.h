// RFC 4648 base64 (the standard alphabet, '=' padding).
#pragma once

#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace qhx {

std::string base64_encode(std::span<const std::byte> bytes);
// The bytes, or nothing when `text` is not base64 (ASCII whitespace is skipped, as Python's
// base64.decodebytes does; padding is required when the length calls for it).
std::optional<std::vector<std::byte>> base64_decode(std::string_view text);

// An RFC 2397 data: URL with base64 data (data:image/png;base64,...), as the bytes it holds.
struct DataUrl {
  enum Status { kOk, kNotADataUrl, kNotBase64, kBadBase64 } status = kNotADataUrl;
  std::vector<std::byte> bytes;
};
DataUrl decode_data_url(std::string_view url);

}  // namespace qhx
