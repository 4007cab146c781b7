#pragma once

// Runs one background concern (heartbeats, expiry, eviction) on its own thread: `tick`
// every `period` from Start() until Stop(). Stop() wakes the thread and joins it; it is safe
// to call twice and is called by the destructor. Thread-safe.

#include <functional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace kvpool {

class PeriodicWorker {
 public:
  PeriodicWorker(std::string name, absl::Duration period, std::function<void()> tick);
  ~PeriodicWorker();
  PeriodicWorker(const PeriodicWorker&) = delete;
  PeriodicWorker& operator=(const PeriodicWorker&) = delete;

  void Start();
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);
  // Runs the next tick now instead of at the end of the period.
  void Wake() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Loop() ABSL_LOCKS_EXCLUDED(mu_);

  const std::string name_;
  const absl::Duration period_;
  const std::function<void()> tick_;
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool woken_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace kvpool
