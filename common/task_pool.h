#pragma once

// A fixed set of threads that run batches of tasks: Run() hands all but the first task to the
// pool, runs the first on the calling thread, and returns when every task has finished;
// Async() hands one task over and returns its future. Thread-safe; callers share the threads.
// Tasks run in the order they were handed over; one that blocks holds its thread meanwhile.

#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace kvpool {

class TaskPool {
 public:
  explicit TaskPool(int threads);
  ~TaskPool();
  TaskPool(const TaskPool&) = delete;
  TaskPool& operator=(const TaskPool&) = delete;

  void Run(std::vector<std::function<void()>> tasks) ABSL_LOCKS_EXCLUDED(mu_);
  // Runs `task` on a thread of the pool (on the caller's, before returning, if there is none).
  // Waking a parked thread took 7-16 us where starting one (std::async) took 14-27 us on idle
  // machines and milliseconds on a loaded one (docs/benchmarks.md).
  template <typename F>
  std::future<std::invoke_result_t<F&>> Async(F task) ABSL_LOCKS_EXCLUDED(mu_) {
    auto packaged =
        std::make_shared<std::packaged_task<std::invoke_result_t<F&>()>>(std::move(task));
    std::future<std::invoke_result_t<F&>> result = packaged->get_future();
    if (threads_.empty()) {
      (*packaged)();
      return result;
    }
    absl::MutexLock lock(&mu_);
    queue_.push_back([packaged] { (*packaged)(); });
    return result;
  }
  // Threads of the pool (the caller's own is not counted).
  int size() const { return static_cast<int>(threads_.size()); }

 private:
  void Loop() ABSL_LOCKS_EXCLUDED(mu_);

  absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace kvpool
