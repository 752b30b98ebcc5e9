#include "util/partial_path.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <string>
#include <system_error>

namespace qhx {
namespace {

constexpr char kPartialTag[] = ".partial-";

std::string hidden_prefix(const std::filesystem::path& out, const char* tag) {
  std::string prefix(".");  // appended piece by piece: GCC 12 warns falsely on "." + string
  prefix.append(out.filename().string()).append(tag);
  return prefix;
}

}  // namespace

std::filesystem::path hidden_sibling(const std::filesystem::path& out, const char* tag) {
  return std::filesystem::absolute(out).parent_path() /
         (hidden_prefix(out, tag) + std::to_string(::getpid()));
}

std::filesystem::path partial_sibling(const std::filesystem::path& out) {
  return hidden_sibling(out, kPartialTag);
}

void remove_stale_partials(const std::filesystem::path& out) {
  const std::filesystem::path parent = std::filesystem::absolute(out).parent_path();
  const std::string prefix = hidden_prefix(out, kPartialTag);
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(parent, error)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(prefix, 0) != 0) continue;
    const std::string pid = name.substr(prefix.size());
    // A pid has at most 7 digits on Linux (pid_max <= 4194304); anything else is not ours.
    if (pid.empty() || pid.size() > 9 || pid.find_first_not_of("0123456789") != std::string::npos) {
      continue;
    }
    // Only the writer's own pid, or one no process has any more, is safe to remove.
    const auto id = static_cast<pid_t>(std::stol(pid));
    const bool own = id == ::getpid();
    const bool gone = !own && ::kill(id, 0) != 0 && errno == ESRCH;
    if (own || gone) std::filesystem::remove_all(entry.path(), error);
  }
}

PartialGuard::~PartialGuard() {
  if (path_.empty()) return;
  std::error_code ignored;
  std::filesystem::remove_all(path_, ignored);
}

}  // namespace qhx
