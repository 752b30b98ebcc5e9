// The CPU backend's execution context: the kernels a context runs (chosen once, when it is made,
// from the CPU's features and the QHX_KERNELS choice), its own thread pool, the working memory of
// each of its threads, and the turn that serialises the forward passes run on it. Every fast
// kernel takes the context it runs on; nothing in the kernels is process-wide, so two models with
// different thread counts, driven from several threads, each compute on their own context.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "kernels/thread_pool.h"

namespace qhx {

// Which fast kernels a context uses. All false: the scalar references.
struct CpuKernels {
  bool avx2 = false;          // x86-64: AVX2 + FMA + F16C
  bool avx512 = false;        // x86-64: AVX-512 F/BW/DQ/VL as well
  bool avx512_vnni = false;   // x86-64: and VNNI (the int8 kernels' packed panels)
  bool neon = false;          // aarch64: the NEON kernels
  bool neon_dotprod = false;  // aarch64: and the ARMv8.2 dot-product instructions

  // The best kernels this CPU runs, kept below `choice`: "" for the best, "reference" (the
  // scalar kernels), "avx2" (x86-64: no AVX-512) or "neon" (aarch64: no dot products), to compare
  // speeds or run a second-best path on a CPU that has the best. Throws Error on another choice.
  static CpuKernels detect(std::string_view choice = "");
  // detect() with the environment variable QHX_KERNELS as the choice (read here, once per call:
  // the runtime calls it when it makes a context).
  static CpuKernels from_environment();

  // "avx2+fma, int8 avx512-vnni", "avx2+fma, int8 avx2", "neon-dotprod", "neon" or "scalar
  // reference": the float and int8 matmul paths.
  std::string describe() const;
};

// Working memory of one thread of a context for the kernels, in numbered slots, each kept at its
// largest size: a prefill's buffers are megabytes, and allocating them on every call costs page
// faults and zeroing (measured: pp512 ~25 % slower). Each op uses slots of its own, so an op's
// tasks may run on the thread whose slots hold the op's inputs. (Activations between ops live in
// the plan's arena, graph/schedule.h.)
class Scratch {
 public:
  enum Slot : int {
    kConvTaps,
    kActivationSplit,
    kInt8Activations,
    kRowBytes,
    kRowScales,
    kAttentionScores,
    kAttentionRows,
    kAttentionCalls,
    kGatheredHead,
    kDeltaRule,
    kSlots,
  };

  Scratch() = default;
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;

  // The object of type T in `slot`, value-initialised on first use and kept. A slot holds one
  // type for the life of the context.
  template <typename T>
  T& object(int slot) {
    Entry& e = entries_[slot];
    if (e.object == nullptr) {
      e.object = new T();
      e.destroy = [](void* p) { delete static_cast<T*>(p); };
      e.type = &type_tag<T>;
    }
    if (e.type != &type_tag<T>) wrong_type(slot);
    return *static_cast<T*>(e.object);
  }
  // Room for at least n values of T in `slot` (what the slot held before is unspecified).
  template <typename T>
  T* buffer(int slot, int64_t n) {
    static_assert(std::is_trivially_copyable_v<T>);
    std::vector<T>& v = object<std::vector<T>>(slot);
    if (static_cast<int64_t>(v.size()) < n) v.resize(n);
    return v.data();
  }
  ~Scratch();

 private:
  struct Entry {
    void* object = nullptr;
    void (*destroy)(void*) = nullptr;
    const void* type = nullptr;
  };
  template <typename T>
  static constexpr char type_tag = 0;
  [[noreturn]] static void wrong_type(int slot);
  Entry entries_[kSlots];
};

class CpuContext {
 public:
  // Throws Error unless 1 ≤ n_threads ≤ 256.
  CpuContext(int n_threads, CpuKernels kernels);
  CpuContext(const CpuContext&) = delete;
  CpuContext& operator=(const CpuContext&) = delete;

  int threads() const { return pool_.size(); }
  const CpuKernels& kernels() const { return kernels_; }

  // The working memory of the calling thread (the pool's worker 0), for the code between ops.
  Scratch& caller_scratch() { return scratch_[0]; }
  // Calls task(i, scratch) once for every i in [0, n_tasks) on the context's threads, with the
  // running thread's working memory; returns when all are done, rethrowing a task's exception.
  void run(int64_t n_tasks, const std::function<void(int64_t task, Scratch& scratch)>& task);
  // Calls rows(begin, end) on blocks of [0, n_rows), each block a whole number of `granularity`
  // rows (the last also takes the remainder), a few blocks per thread to even out their speeds.
  // With under 2^16 multiply-adds of `work`, or fewer than two granules of rows, the caller does
  // it all: waking the threads would cost more. Rows computed the same way wherever they fall
  // give the same result on any number of threads.
  void split_rows(int64_t n_rows, int64_t granularity, int64_t work,
                  const std::function<void(int64_t begin, int64_t end)>& rows);

  // A forward pass's exclusive use of the context: callers on several threads (the sessions of
  // the models that share it) take turns, first come first served.
  class Turn {
   public:
    explicit Turn(CpuContext& context);
    ~Turn();
    Turn(const Turn&) = delete;
    Turn& operator=(const Turn&) = delete;

   private:
    CpuContext& context_;
  };

 private:
  CpuKernels kernels_;
  ThreadPool pool_;
  std::unique_ptr<Scratch[]> scratch_;  // one per thread of the pool
  std::mutex turn_mutex_;
  std::condition_variable turn_changed_;
  uint64_t next_ticket_ = 0;
  uint64_t serving_ = 0;
};

}  // namespace qhx
