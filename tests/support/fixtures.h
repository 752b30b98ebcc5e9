// Paths shared by the tests: the repo root and ../shared, independent of the working directory.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

namespace qhx::test {

inline std::filesystem::path source_dir() {
  return QHX_SOURCE_DIR;
}

inline std::filesystem::path shared_dir() {
  if (const char* env = std::getenv("QHX_SHARED_DIR")) return env;
  return source_dir().parent_path() / "shared";
}

// n samples of N(0, scale²) from a fixed seed.
inline std::vector<float> random_vector(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// The whole file as bytes ("" if it cannot be read).
std::string read_file(const std::filesystem::path& path);

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
