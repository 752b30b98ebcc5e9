// qhx chat: an interactive terminal chat, built on the C API.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "common.h"

namespace qhx::cli {

struct ChatArgs {
  std::string model;
  DeviceArgs devices;
  std::string system;  // system prompt, if any
  int64_t max_new_tokens = 1024;
  int64_t context_length = 0;    // 0: memory admission decides
  std::optional<bool> thinking;  // --think / --no-think; unset: the template's default
  bool greedy = false;
  std::optional<uint64_t> seed;
  bool stats = false;  // print speed figures after every reply
  int threads = 0;
  SpeculativeArgs speculative;  // drafts verified several tokens per pass
};

// Reads turns from stdin until EOF or /exit. Returns the process exit code.
int run_chat(const ChatArgs& args);

}  // namespace qhx::cli
