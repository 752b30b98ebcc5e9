#include "kernels/cpu_context.h"

#include <algorithm>
#include <cstdlib>

#if defined(__x86_64__)
#include <cpuid.h>
#elif defined(__aarch64__)
#include "kernels/neon.h"
#endif

#include "util/error.h"

namespace qhx {

CpuKernels CpuKernels::detect(std::string_view choice) {
  if (!choice.empty() && choice != "reference" && choice != "avx2" && choice != "neon") {
    std::string message(choice);  // (GCC 12 warns, wrongly, of "..." + std::string)
    message += " is not one of reference, avx2 (x86-64) or neon (aarch64)";
    fail("QHX_KERNELS", message);
  }
  CpuKernels k;
  if (choice == "reference") return k;
#if defined(__x86_64__)
  // F16C via CPUID leaf 1, ECX bit 29: not every compiler's __builtin_cpu_supports knows it.
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & (1u << 29)) != 0;
  k.avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
  k.avx512 = k.avx2 && choice != "avx2" && __builtin_cpu_supports("avx512f") &&
             __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
             __builtin_cpu_supports("avx512vl");
  k.avx512_vnni = k.avx512 && __builtin_cpu_supports("avx512vnni");
#elif defined(__aarch64__)
  k.neon = true;  // part of the aarch64 baseline
  k.neon_dotprod = choice != "neon" && neon::dotprod_available();
#endif
  return k;
}

CpuKernels CpuKernels::from_environment() {
  const char* choice = std::getenv("QHX_KERNELS");
  return detect(choice == nullptr ? "" : choice);
}

std::string CpuKernels::describe() const {
  if (avx2) return avx512_vnni ? "avx2+fma, int8 avx512-vnni" : "avx2+fma, int8 avx2";
  if (neon) return neon_dotprod ? "neon-dotprod" : "neon";
  return "scalar reference";
}

Scratch::~Scratch() {
  for (Entry& e : entries_) {
    if (e.object != nullptr) e.destroy(e.object);
  }
}

void Scratch::wrong_type(int slot) {
  fail("scratch", "slot " + std::to_string(slot) + " used with two types");
}

CpuContext::CpuContext(int n_threads, CpuKernels kernels)
    : kernels_(kernels), pool_(n_threads), scratch_(std::make_unique<Scratch[]>(n_threads)) {}

void CpuContext::run(int64_t n_tasks,
                     const std::function<void(int64_t task, Scratch& scratch)>& task) {
  pool_.run(n_tasks, [&](int64_t i, int worker) { task(i, scratch_[worker]); });
}

void CpuContext::split_rows(int64_t n_rows, int64_t granularity, int64_t work,
                            const std::function<void(int64_t begin, int64_t end)>& rows) {
  if (pool_.size() == 1 || work < (int64_t{1} << 16) || n_rows < 2 * granularity) {
    return rows(0, n_rows);
  }
  const int64_t granules = n_rows / granularity;
  const int64_t blocks = std::min<int64_t>(granules, 4 * pool_.size());
  pool_.run(blocks, [&](int64_t b, int) {
    const int64_t begin = granularity * (granules * b / blocks);
    const int64_t end = b + 1 == blocks ? n_rows : granularity * (granules * (b + 1) / blocks);
    rows(begin, end);
  });
}

CpuContext::Turn::Turn(CpuContext& context) : context_(context) {
  std::unique_lock lock(context_.turn_mutex_);
  const uint64_t ticket = context_.next_ticket_++;
  context_.turn_changed_.wait(lock, [&] { return context_.serving_ == ticket; });
}

CpuContext::Turn::~Turn() {
  {
    const std::lock_guard lock(context_.turn_mutex_);
    ++context_.serving_;
  }
  context_.turn_changed_.notify_all();
}

}  // namespace qhx
