// Errors that reach the user: one line naming the file (or input) and what is wrong with it.
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>

namespace qhx {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Throws Error("<where>: <what>"). `where` is a file path, optionally with a field, e.g.
// "model/config.json: hidden_size".
[[noreturn]] void fail(std::string_view where, std::string_view what);

}  // namespace qhx
