// Writing files and directories atomically: under a hidden sibling name first, renamed into place
// once whole, so an error or a kill never leaves half of one at the real name.
#pragma once

#include <filesystem>

namespace qhx {

// ".<name><tag><pid>" beside `out`: a name no bundle or file is mistaken for.
std::filesystem::path hidden_sibling(const std::filesystem::path& out, const char* tag);
// ".<name>.partial-<pid>" beside `out`.
std::filesystem::path partial_sibling(const std::filesystem::path& out);

// Removes the partial siblings of `out` whose process no longer runs (a killed earlier run's).
void remove_stale_partials(const std::filesystem::path& out);

// Removes a partial sibling when the write it holds fails (unless released once renamed).
class PartialGuard {
 public:
  explicit PartialGuard(std::filesystem::path path) : path_(std::move(path)) {}
  ~PartialGuard();
  PartialGuard(const PartialGuard&) = delete;
  PartialGuard& operator=(const PartialGuard&) = delete;
  void release() { path_.clear(); }

 private:
  std::filesystem::path path_;
};

}  // namespace qhx
