#include "util/partial_path.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <string>
#include <system_error>

namespace qhx {
namespace {

std::string partial_prefix(const std::filesystem::path& out) {
  std::string prefix(".");  // appended piece by piece: GCC 12 warns falsely on "." + string
  prefix.append(out.filename().string()).append(".partial-");
  return prefix;
}

}  // namespace

std::filesystem::path partial_sibling(const std::filesystem::path& out) {
  return std::filesystem::absolute(out).parent_path() /
         (partial_prefix(out) + std::to_string(::getpid()));
}

void remove_stale_partials(const std::filesystem::path& out) {
  const std::filesystem::path parent = std::filesystem::absolute(out).parent_path();
  const std::string prefix = partial_prefix(out);
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(parent, error)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(prefix, 0) != 0) continue;
    const std::string pid = name.substr(prefix.size());
    if (pid.empty() || pid.find_first_not_of("0123456789") != std::string::npos) continue;
    // Only the writer's own pid, or one no process has any more, is safe to remove.
    const long id = std::stol(pid);
    if (id != ::getpid() && ::kill(static_cast<pid_t>(id), 0) == 0) continue;
    if (id != ::getpid() && errno != ESRCH) continue;
    std::filesystem::remove_all(entry.path(), error);
  }
}

PartialGuard::~PartialGuard() {
  if (path_.empty()) return;
  std::error_code ignored;
  std::filesystem::remove_all(path_, ignored);
}

}  // namespace qhx
