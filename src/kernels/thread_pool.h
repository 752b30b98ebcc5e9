// A persistent pool of worker threads for the kernels. Decode steps are short (a matmul of a
// small model takes tens of microseconds), so workers spin briefly for the next job before they
// sleep, and the calling thread works too. Which thread computes which task never changes a
// result: tasks write disjoint outputs, each computed the same way.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace qhx {

class ThreadPool {
 public:
  explicit ThreadPool(int n_threads);  // n_threads ≥ 1 counts the caller
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }
  // Calls task(i) once for every i in [0, n_tasks), on all threads; returns when all are done.
  // One run at a time: callers do not share a pool across threads.
  void run(int64_t n_tasks, const std::function<void(int64_t)>& task);

 private:
  void worker_loop();
  void work_on_current_job();

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::atomic<uint64_t> generation_{0};  // bumped for every job
  std::atomic<int64_t> next_task_{0};
  std::atomic<int> busy_workers_{0};
  int64_t n_tasks_ = 0;
  const std::function<void(int64_t)>* task_ = nullptr;
  bool stopping_ = false;
};

// Calls rows(begin, end) on blocks of [0, n_rows) spread over the kernel pool, each block a whole
// number of `granularity` rows (the last also takes the remainder), a few blocks per thread to
// even out their speeds. With under 2^16 multiply-adds of `work`, or fewer than two granules of
// rows, the caller does it all: waking the threads would cost more. Rows computed the same way
// wherever they fall give the same result on any number of threads.
void split_rows(int64_t n_rows, int64_t granularity, int64_t work,
                const std::function<void(int64_t begin, int64_t end)>& rows);

// Calls task(i) once for every i in [0, n_tasks) on up to n_threads threads started for the
// purpose (the caller is one of them), apart from the kernel pool, which another thread's work may
// hold. Returns when all are done; if tasks threw, rethrows the first exception, after the
// remaining tasks have run.
void run_on_own_threads(int64_t n_tasks, int n_threads, const std::function<void(int64_t)>& task);

// Every hardware thread the process may run on (at least 1, at most 256): the default count.
int hardware_threads();

// The pool the kernels use (created on first use with kernel_threads() threads).
void set_kernel_threads(int n_threads);  // throws Error unless 1 ≤ n ≤ 256
int kernel_threads();
ThreadPool& kernel_pool();

}  // namespace qhx
