#include "runtime/stop_strings.h"

#include <algorithm>
#include <utility>

#include "util/error.h"
#include "util/utf8.h"

namespace qhx {

StopStringMatcher::StopStringMatcher(std::vector<std::string> stop_strings)
    : stops_(std::move(stop_strings)) {
  for (const std::string& s : stops_) {
    if (s.empty()) fail("stop string", "empty (it would stop before the first token)");
    if (find_invalid_utf8(s) != std::string_view::npos) {
      fail("stop string", "'" + s + "' is not valid UTF-8");
    }
  }
}

StopStringMatcher::Piece StopStringMatcher::push(std::string_view text) {
  if (stopped_) return {"", true};
  held_.append(text);
  // The earliest stop string wins: held_ never holds a complete one from an earlier push.
  size_t first = std::string::npos;
  for (const std::string& s : stops_) first = std::min(first, held_.find(s));
  if (first != std::string::npos) {
    stopped_ = true;
    Piece out{held_.substr(0, first), true};
    held_.clear();
    return out;
  }
  // Hold back the longest suffix that is a proper prefix of some stop string.
  const std::string_view held(held_);
  size_t keep = 0;
  for (const std::string& s : stops_) {
    for (size_t k = std::min(s.size() - 1, held.size()); k > keep; --k) {
      if (held.ends_with(std::string_view(s).substr(0, k))) {
        keep = k;
        break;
      }
    }
  }
  Piece out{held_.substr(0, held_.size() - keep), false};
  held_.erase(0, held_.size() - keep);
  return out;
}

std::string StopStringMatcher::flush() {
  std::string out;
  out.swap(held_);
  return out;
}

}  // namespace qhx
