#pragma once

// A fixed set of threads that run batches of tasks: Run() hands all but the first task to the
// pool, runs the first on the calling thread, and returns when every task has finished.
// Thread-safe; batches from several callers share the threads.

#include <deque>
#include <functional>
#include <thread>
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
