// A persistent pool of worker threads. Decode steps are short (a matmul of a small model takes
// tens of microseconds), so workers spin briefly for the next job before they sleep, and the
// calling thread works too. Which thread computes which task never changes a result: tasks write
// disjoint outputs, each computed the same way. A pool belongs to one CPU context
// (kernels/cpu_context.h); there is no process-wide pool.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace qhx {

class ThreadPool {
 public:
  explicit ThreadPool(int n_threads);  // 1 ≤ n_threads ≤ 256, counting the caller
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }
  // Calls task(i, worker) once for every i in [0, n_tasks), on all threads; `worker` is the
  // running thread's index in [0, size()), 0 for the caller. Returns when all are done. If tasks
  // throw, the tasks not yet started are skipped and the first exception is rethrown here.
  // One run at a time: the pool's owner serialises its callers.
  using Task = std::function<void(int64_t task, int worker)>;
  void run(int64_t n_tasks, const Task& task);

 private:
  void worker_loop(int worker);
  void work_on_current_job(int worker);

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::atomic<uint64_t> generation_{0};  // bumped for every job
  std::atomic<int64_t> next_task_{0};
  std::atomic<int> busy_workers_{0};
  int64_t n_tasks_ = 0;
  const Task* task_ = nullptr;
  bool stopping_ = false;
  std::mutex failure_mutex_;
  std::exception_ptr failure_;  // the job's first exception
};

// Calls task(i) once for every i in [0, n_tasks) on up to n_threads threads started for the
// purpose (the caller is one of them), apart from any context's pool (loading a model must not
// wait for another model's forward pass). Returns when all are done; if tasks threw, rethrows the
// first exception, after the remaining tasks have run.
void run_on_own_threads(int64_t n_tasks, int n_threads, const std::function<void(int64_t)>& task);

// Every hardware thread the process may run on (at least 1, at most 256): the default count.
int hardware_threads();

}  // namespace qhx
