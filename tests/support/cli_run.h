// Runs the qhx command line as a user would, through /bin/sh, and collects what it printed.
// QHX_CLI_PATH (the built binary) is defined for every test target (tests/CMakeLists.txt).
#pragma once

#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <optional>
#include <string>

#include "support/fixtures.h"

namespace qhx::test {

struct CliRun {
  int exit_code = -1;
  std::string out, err;
};

// An environment variable set for a scope (the commands it runs inherit it), restored after
// it however the scope ends: a failed assertion leaves no setting behind for later tests.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    ::setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (old_) {
      ::setenv(name_, old_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

// `qhx <args>` (args are shell words), with `input` on stdin.
inline CliRun run_qhx(const std::string& args, const std::string& input = "") {
  TempDir io;
  std::ofstream(io.path() / "in", std::ios::binary) << input;
  const std::string command = std::string(QHX_CLI_PATH) + " " + args + " <" +
                              (io.path() / "in").string() + " >" + (io.path() / "out").string() +
                              " 2>" + (io.path() / "err").string();
  const int status = std::system(command.c_str());
  CliRun r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = read_file(io.path() / "out");
  r.err = read_file(io.path() / "err");
  return r;
}

}  // namespace qhx::test
