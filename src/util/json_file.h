// Reading JSON files from outside with errors that name the file and the field.
#pragma once

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace qhx {

using Json = nlohmann::json;

// Parses a whole file; a missing file or malformed JSON throws Error naming the file.
Json read_json_file(const std::filesystem::path& path);
// Parses text that came from `where` (a file name or "stdin"). With `unique_keys`, a key the
// top-level object repeats is an Error (JSON lets the last one win without a word).
Json parse_json(std::string_view text, std::string_view where, bool unique_keys = false);

// "<where>: <key>", the way errors name a field.
std::string field(std::string_view where, std::string_view key);

// Field access that reports "<where>: <key>: ..." on a missing key or a wrong type.
const Json& require_field(const Json& object, std::string_view key, std::string_view where);
std::string require_string(const Json& object, std::string_view key, std::string_view where);
int64_t require_int(const Json& object, std::string_view key, std::string_view where);
double require_number(const Json& object, std::string_view key, std::string_view where);

}  // namespace qhx
