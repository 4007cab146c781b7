#pragma once

// One background thread that handles queued items in order. Push() hands it an item,
// WaitIdle() waits until every item pushed so far is handled, Stop() lets it finish what is
// queued and joins it (also called by the destructor). The handler runs without the worker's
// lock held. Thread-safe.

#include <deque>
#include <functional>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace kvpool {

template <typename T>
class QueueWorker {
 public:
  explicit QueueWorker(std::function<void(T&)> handle) : handle_(std::move(handle)) {}
  ~QueueWorker() { Stop(); }
  QueueWorker(const QueueWorker&) = delete;
  QueueWorker& operator=(const QueueWorker&) = delete;

  void Start() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    if (thread_.joinable() || stopping_) return;
    thread_ = std::thread([this] { Loop(); });
  }

  void Stop() ABSL_LOCKS_EXCLUDED(mu_) {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
    }
    if (thread_.joinable()) thread_.join();
  }

  void Push(T item) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    queue_.push_back(std::move(item));
  }

  void WaitIdle() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return queue_.empty() && !busy_; };
    mu_.Await(absl::Condition(&idle));
  }

 private:
  void Loop() ABSL_LOCKS_EXCLUDED(mu_) {
    while (true) {
      T item;
      {
        absl::MutexLock lock(&mu_);
        auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return !queue_.empty() || stopping_;
        };
        mu_.Await(absl::Condition(&ready));
        if (queue_.empty()) return;  // stopping, and everything queued was handled
        item = std::move(queue_.front());
        queue_.pop_front();
        busy_ = true;
      }
      handle_(item);
      absl::MutexLock lock(&mu_);
      busy_ = false;
    }
  }

  const std::function<void(T&)> handle_;
  absl::Mutex mu_;
  std::deque<T> queue_ ABSL_GUARDED_BY(mu_);
  bool busy_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace kvpool
