// Stop strings over streamed text: holds back what could still become a stop string, so that
// nothing of a stop string is ever shown, even when it spans several token pieces.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace qhx {

class StopStringMatcher {
 public:
  struct Piece {
    std::string text;      // safe to emit now
    bool stopped = false;  // a stop string completed: `text` ends just before it
  };

  // Throws Error on an empty or invalid-UTF-8 stop string. No stop strings: text passes through.
  explicit StopStringMatcher(std::vector<std::string> stop_strings);

  // Matching is byte-wise, so a piece may end inside a multi-byte character; on valid UTF-8 the
  // cut never falls inside one. After a stop, further pushes return nothing.
  Piece push(std::string_view text);
  // The text held back at the end of generation (empty after a stop).
  std::string flush();
  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stops_;
  std::string held_;
  bool stopped_ = false;
};

}  // namespace qhx
