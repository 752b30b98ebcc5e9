#include "support/fixtures.h"

#include <unistd.h>

#include <string>

namespace qhx::test {

TempDir::TempDir() {
  std::string pattern = (std::filesystem::temp_directory_path() / "qhx-test-XXXXXX").string();
  if (::mkdtemp(pattern.data()) == nullptr) std::abort();
  path_ = pattern;
}

TempDir::~TempDir() {
  std::error_code ignored;
  std::filesystem::remove_all(path_, ignored);
}

}  // namespace qhx::test
