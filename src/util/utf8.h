// UTF-8 validation and incremental decoding helpers.
#pragma once

#include <cstddef>
#include <string_view>

namespace qhx {

// Byte offset of the first invalid UTF-8 sequence, or npos when `text` is valid UTF-8
// (overlong forms, surrogates and code points past U+10FFFF are invalid).
size_t find_invalid_utf8(std::string_view text);

// Length of the longest suffix of `bytes` that is the start of a UTF-8 sequence still
// waiting for continuation bytes (0 when the text ends on a character boundary).
size_t incomplete_utf8_suffix(std::string_view bytes);

}  // namespace qhx
