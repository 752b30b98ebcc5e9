// Built into qhx_xgrammar, which is compiled with XGRAMMAR_LOG_CUSTOMIZE=1: these are the two
// functions its logging.h then leaves to its user.
#include "grammar/xgrammar_log.h"

#include <support/logging.h>  // xgrammar's

namespace qhx {
namespace {
thread_local std::vector<std::string>* warnings = nullptr;
}  // namespace

XgrammarWarnings::XgrammarWarnings() {
  warnings = &messages_;
}
XgrammarWarnings::~XgrammarWarnings() {
  warnings = nullptr;
}

}  // namespace qhx

namespace xgrammar {

[[noreturn]] void LogFatalImpl(const std::string& file, int lineno, const std::string& message) {
  throw LogFatalError(file, lineno, message);
}

void LogMessageImpl(const std::string&, int, int level, const std::string& message) {
  if (level == XGRAMMAR_LOG_LEVEL_WARNING && qhx::warnings) qhx::warnings->push_back(message);
}

}  // namespace xgrammar
