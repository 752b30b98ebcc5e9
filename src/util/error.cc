#include "util/error.h"

namespace qhx {

void fail(std::string_view where, std::string_view what, ErrorKind kind) {
  std::string message(where);
  message += ": ";
  message += what;
  throw Error(message, kind);
}

}  // namespace qhx
