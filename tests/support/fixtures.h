// Paths shared by the tests: the repo root and ../shared, independent of the working directory.
#pragma once

#include <cstdlib>
#include <filesystem>

namespace qhx::test {

inline std::filesystem::path source_dir() { return QHX_SOURCE_DIR; }

inline std::filesystem::path shared_dir() {
  if (const char* env = std::getenv("QHX_SHARED_DIR")) return env;
  return source_dir().parent_path() / "shared";
}

// A fresh empty directory under the system temp dir, removed by the destructor.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

}  // namespace qhx::test
