// xgrammar's log, routed: a library prints nothing to stderr. Its warnings (a schema keyword it
// cannot hold a reply to, a bound it drops) are collected on the thread that compiles while an
// XgrammarWarnings lives there; the rest of its log is dropped, its fatal errors are thrown.
#pragma once

#include <string>
#include <vector>

namespace qhx {

class XgrammarWarnings {
 public:
  XgrammarWarnings();  // collects this thread's warnings until destroyed (not nested)
  ~XgrammarWarnings();
  XgrammarWarnings(const XgrammarWarnings&) = delete;
  XgrammarWarnings& operator=(const XgrammarWarnings&) = delete;

  const std::vector<std::string>& messages() const { return messages_; }

 private:
  std::vector<std::string> messages_;
};

}  // namespace qhx
