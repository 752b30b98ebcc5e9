// The CPU contexts tests run kernels and models on.
#pragma once

#include <memory>

#include "kernels/cpu_context.h"

namespace qhx::test {

// `threads` threads, the kernels QHX_KERNELS allows (the neon.* and reference copies of the
// kernel tests set it).
inline std::shared_ptr<CpuContext> cpu(int threads = 1) {
  return std::make_shared<CpuContext>(threads, CpuKernels::from_environment());
}

}  // namespace qhx::test
