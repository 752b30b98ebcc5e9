// JSON from outside the process (request bodies, chat requests) parsed in O(n log n) time at worst,
// with bounds on nesting, object keys and array length. nlohmann's ordered_json keeps key order
// (templates render objects as sent) but finds keys by linear search, so its own parser takes
// quadratic time on an object of many keys; this one finds repeated keys by sorting them once
// the object closes.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

namespace qhx {

struct JsonBounds {
  size_t max_depth = 64;
  // A logit_bias over a whole 248k vocabulary fits. Repeated keys count.
  size_t max_object_keys = size_t{1} << 18;
  // A prompt of token ids as long as the longest context (262,144) fits.
  size_t max_array_length = size_t{1} << 20;
};

// The parsed document, or nothing with `error` saying why ("nested deeper than 64 levels",
// "invalid JSON at byte 12: syntax error ..."). A key given twice keeps its first position and its
// last value, as nlohmann's parser does.
std::optional<nlohmann::ordered_json> parse_bounded_json(std::string_view text,
                                                         const JsonBounds& bounds,
                                                         std::string* error);

}  // namespace qhx
