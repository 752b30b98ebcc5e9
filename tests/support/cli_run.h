// Runs the qhx command line as a user would, through /bin/sh, and collects what it printed.
// QHX_CLI_PATH (the built binary) is defined for every test target (tests/CMakeLists.txt).
#pragma once

#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "support/fixtures.h"

namespace qhx::test {

struct CliRun {
  int exit_code = -1;
  std::string out, err;
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
