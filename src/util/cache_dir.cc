#include "util/cache_dir.h"

#include <cstdlib>

namespace qhx {

std::filesystem::path default_cache_dir() {
  if (const char* dir = std::getenv("QHX_CACHE_DIR"); dir != nullptr && *dir != '\0') return dir;
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg != nullptr && *xdg != '\0') {
    return std::filesystem::path(xdg) / "qhx";
  }
  if (const char* home = std::getenv("HOME"); home != nullptr && *home != '\0') {
    return std::filesystem::path(home) / ".cache" / "qhx";
  }
  return {};
}

}  // namespace qhx
