#include "common/task_pool.h"

#include "absl/synchronization/blocking_counter.h"

namespace kvpool {

TaskPool::TaskPool(int threads) {
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Loop(); });
}

TaskPool::~TaskPool() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& thread : threads_) thread.join();
}

void TaskPool::Run(std::vector<std::function<void()>> tasks) {
  if (tasks.empty()) return;
  if (tasks.size() == 1 || threads_.empty()) {
    for (auto& task : tasks) task();
    return;
  }
  absl::BlockingCounter done(static_cast<int>(tasks.size() - 1));
  {
    absl::MutexLock lock(&mu_);
    for (size_t i = 1; i < tasks.size(); ++i) {
      queue_.push_back([&done, task = std::move(tasks[i])] {
        task();
        done.DecrementCount();
      });
    }
  }
  tasks[0]();
  done.Wait();
}

void TaskPool::Loop() {
  while (true) {
    std::function<void()> task;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || !queue_.empty();
      };
      mu_.Await(absl::Condition(&ready));
      if (queue_.empty()) return;
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task();
  }
}

}  // namespace kvpool
