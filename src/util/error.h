// Errors that reach the user: one line naming the file (or input) and what is wrong with it.
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>

namespace qhx {

// What the caller can do about an error: most mean "fix the input"; kContextFull and
// kOutOfMemory mean "ask for less" (a server answers them differently); kDeviceFailed means an
// accelerator failed (lost, out of its memory, timed out) and the CPU can redo the work.
enum class ErrorKind { kInvalidInput, kContextFull, kOutOfMemory, kDeviceFailed };

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message, ErrorKind kind = ErrorKind::kInvalidInput)
      : std::runtime_error(message), kind_(kind) {}
  ErrorKind kind() const { return kind_; }

 private:
  ErrorKind kind_;
};

// Throws Error("<where>: <what>"). `where` is a file path, optionally with a field, e.g.
// "model/config.json: hidden_size".
[[noreturn]] void fail(std::string_view where, std::string_view what,
                       ErrorKind kind = ErrorKind::kInvalidInput);

}  // namespace qhx
