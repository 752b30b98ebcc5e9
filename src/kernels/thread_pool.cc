#include "kernels/thread_pool.h"

#ifdef __linux__
#include <sched.h>
#endif

#include <algorithm>
#include <exception>
#include <memory>
#include <string>
#include <thread>
#include <utility>

#include "util/error.h"

namespace qhx {
namespace {

constexpr int kSpinsBeforeSleep = 20000;

}  // namespace

ThreadPool::ThreadPool(int n_threads) {
  if (n_threads < 1 || n_threads > 256) {
    fail("threads", std::to_string(n_threads) + " is not between 1 and 256");
  }
  for (int i = 1; i < n_threads; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    generation_.fetch_add(1, std::memory_order_release);
  }
  wake_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void ThreadPool::work_on_current_job(int worker) {
  for (int64_t i = next_task_.fetch_add(1, std::memory_order_relaxed); i < n_tasks_;
       i = next_task_.fetch_add(1, std::memory_order_relaxed)) {
    try {
      (*task_)(i, worker);
    } catch (...) {
      const std::lock_guard lock(failure_mutex_);
      if (!failure_) failure_ = std::current_exception();
      next_task_.store(n_tasks_, std::memory_order_relaxed);  // skip what has not started
    }
  }
}

void ThreadPool::worker_loop(int worker) {
  uint64_t seen = 0;
  while (true) {
    int spins = 0;
    while (generation_.load(std::memory_order_acquire) == seen && spins < kSpinsBeforeSleep) {
      ++spins;
    }
    if (generation_.load(std::memory_order_acquire) == seen) {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return generation_.load(std::memory_order_acquire) != seen; });
    }
    seen = generation_.load(std::memory_order_acquire);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (stopping_) return;
    }
    work_on_current_job(worker);
    busy_workers_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

void ThreadPool::run(int64_t n_tasks, const Task& task) {
  if (workers_.empty() || n_tasks <= 1) {
    for (int64_t i = 0; i < n_tasks; ++i) task(i, 0);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    task_ = &task;
    n_tasks_ = n_tasks;
    next_task_.store(0, std::memory_order_relaxed);
    busy_workers_.store(static_cast<int>(workers_.size()), std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_release);
  }
  wake_.notify_all();
  work_on_current_job(0);
  while (busy_workers_.load(std::memory_order_acquire) != 0) {
  }
  std::exception_ptr failure;
  {
    const std::lock_guard lock(failure_mutex_);
    failure = std::exchange(failure_, nullptr);
  }
  if (failure) std::rethrow_exception(failure);
}

int hardware_threads() {
  // The CPUs this process may use (taskset, cgroup cpusets), not every CPU of the machine.
  int n = 0;
#ifdef __linux__
  cpu_set_t allowed;
  if (sched_getaffinity(0, sizeof(allowed), &allowed) == 0) n = CPU_COUNT(&allowed);
#endif
  if (n < 1) n = static_cast<int>(std::thread::hardware_concurrency());
  return std::clamp(n, 1, 256);
}

void run_on_own_threads(int64_t n_tasks, int n_threads, const std::function<void(int64_t)>& task) {
  std::atomic<int64_t> next{0};
  std::mutex failure_mutex;
  std::exception_ptr failure;
  const auto work = [&] {
    for (int64_t i; (i = next++) < n_tasks;) {
      try {
        task(i);
      } catch (...) {
        const std::lock_guard lock(failure_mutex);
        if (!failure) failure = std::current_exception();
      }
    }
  };
  std::vector<std::thread> helpers;
  for (int64_t t = 1; t < std::min<int64_t>(n_threads, n_tasks); ++t) helpers.emplace_back(work);
  work();
  for (std::thread& helper : helpers) helper.join();
  if (failure) std::rethrow_exception(failure);
}

}  // namespace qhx
