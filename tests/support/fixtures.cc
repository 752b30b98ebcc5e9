#include "support/fixtures.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <string>

namespace qhx::test {

std::vector<std::filesystem::path> fixture_checkpoints() {
  std::vector<std::filesystem::path> dirs;
  for (const char* family : {"qwen3", "qwen3_5"}) {
    for (const auto& e :
         std::filesystem::directory_iterator(source_dir() / "tests" / "fixtures" / family)) {
      if (std::filesystem::exists(e.path() / "config.json")) dirs.push_back(e.path());
    }
  }
  std::sort(dirs.begin(), dirs.end());
  return dirs;
}

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

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
