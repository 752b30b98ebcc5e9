// Python str semantics on UTF-8 text for the template engine: strings index, slice and count by
// code point, and strip/split/upper/lower treat Unicode as Python does.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace qhx::jinja::text {

// The text must be valid UTF-8 (templates and JSON inputs are checked on the way in).
std::vector<char32_t> decode(std::string_view s);
void append_utf8(std::string& out, char32_t cp);
std::string encode(const std::vector<char32_t>& cps);
size_t length(std::string_view s);  // code points

bool is_space(char32_t cp);      // str.isspace
bool is_printable(char32_t cp);  // str.isprintable

// str.strip/lstrip/rstrip: chars == nullptr strips whitespace.
std::string strip(std::string_view s, const std::string* chars, bool left, bool right);
// str.split(sep, maxsplit); sep == nullptr splits on whitespace runs.
std::vector<std::string> split(std::string_view s, const std::string* sep, int64_t maxsplit);
std::string upper(std::string_view s);
std::string lower(std::string_view s);
std::string capitalize(std::string_view s);  // str.capitalize
std::string title(std::string_view s);       // jinja2's title filter
// str.replace(old, new, count) with count < 0 meaning all.
std::string replace(std::string_view s, std::string_view from, std::string_view to, int64_t count);
int64_t count(std::string_view s, std::string_view sub);
int64_t find(std::string_view s, std::string_view sub);  // in code points, -1 if absent

}  // namespace qhx::jinja::text
