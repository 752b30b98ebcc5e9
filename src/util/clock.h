// Wall time for the runtime's own figures (TTFT, tok/s): a monotonic clock.
#pragma once

#include <chrono>

namespace qhx {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace qhx
