// Paths shared by the tests, independent of the working directory. Everything a test reads is
// inside the repository: a clone must pass on its own.
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

// The genuine tokenizer files and Hugging Face's reference ids for them ("qwen3", "qwen3_5").
inline std::filesystem::path tokenizer_fixture_dir(const std::string& family) {
  return source_dir() / "tests" / "fixtures" / "tokenizer" / family;
}

// How many times slower than a release build this one runs. The few tests that bound a time check
// a complexity or a starvation (quadratic parsing took 12 s, a starved /health seconds), not speed:
// their bounds scale by it so that a sanitizer build checks the same thing.
#if !defined(__has_feature)
#define __has_feature(x) 0  // GCC: the __SANITIZE_* macros below say it
#endif
// ThreadSanitizer costs the most (a 1-token completion on a loaded 2-core machine took 4.2 s).
#if defined(__SANITIZE_THREAD__) || __has_feature(thread_sanitizer)
constexpr double kBuildSlowdown = 10.0;
#elif defined(__SANITIZE_ADDRESS__) || __has_feature(address_sanitizer)
constexpr double kBuildSlowdown = 4.0;
#else
constexpr double kBuildSlowdown = 1.0;
#endif

// n samples of N(0, scale²) from a fixed seed.
inline std::vector<float> random_vector(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// Every fixture checkpoint directory (tests/fixtures/{qwen3,qwen3_5}/* with a config.json),
// sorted.
std::vector<std::filesystem::path> fixture_checkpoints();

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
