#include "util/json_file.h"

#include <set>

#include "util/error.h"
#include "util/mapped_file.h"

namespace qhx {

Json read_json_file(const std::filesystem::path& path) {
  return parse_json(read_regular_file(path), path.string());
}

Json parse_json(std::string_view text, std::string_view where, bool unique_keys) {
  std::set<std::string> keys;
  std::string repeated;
  // Keys of the top-level object; JSON itself lets the last of two equal keys win silently.
  const Json::parser_callback_t note_key = [&](int depth, Json::parse_event_t event, Json& key) {
    if (depth == 1 && event == Json::parse_event_t::key && repeated.empty() &&
        !keys.insert(key.get<std::string>()).second) {
      repeated = key.get<std::string>();
    }
    return true;
  };
  try {
    Json json = unique_keys ? Json::parse(text, note_key) : Json::parse(text);
    if (!repeated.empty()) fail(where, "'" + repeated + "' appears twice");
    return json;
  } catch (const Json::parse_error& e) {
    fail(where, std::string("invalid JSON at byte ") + std::to_string(e.byte) + ": " + e.what());
  } catch (const Json::exception& e) {  // e.g. a number too large for a double
    fail(where, std::string("invalid JSON: ") + e.what());
  }
}

std::string field(std::string_view where, std::string_view key) {
  return std::string(where) + ": " + std::string(key);
}

const Json& require_field(const Json& object, std::string_view key, std::string_view where) {
  if (!object.is_object()) fail(where, "expected a JSON object");
  auto it = object.find(key);
  if (it == object.end()) fail(std::string(where) + ": " + std::string(key), "missing");
  return *it;
}

std::string require_string(const Json& object, std::string_view key, std::string_view where) {
  const Json& v = require_field(object, key, where);
  if (!v.is_string()) fail(std::string(where) + ": " + std::string(key), "expected a string");
  return v.get<std::string>();
}

int64_t require_int(const Json& object, std::string_view key, std::string_view where) {
  const Json& v = require_field(object, key, where);
  if (!v.is_number_integer()) {
    fail(std::string(where) + ": " + std::string(key), "expected an integer");
  }
  return v.get<int64_t>();
}

double require_number(const Json& object, std::string_view key, std::string_view where) {
  const Json& v = require_field(object, key, where);
  if (!v.is_number()) fail(std::string(where) + ": " + std::string(key), "expected a number");
  return v.get<double>();
}

}  // namespace qhx
