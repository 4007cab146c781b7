#include "common/periodic_worker.h"

namespace kvpool {

PeriodicWorker::PeriodicWorker(std::string name, absl::Duration period, std::function<void()> tick)
    : name_(std::move(name)), period_(period), tick_(std::move(tick)) {}

PeriodicWorker::~PeriodicWorker() { Stop(); }

void PeriodicWorker::Start() { thread_ = std::thread([this] { Loop(); }); }

void PeriodicWorker::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void PeriodicWorker::Wake() {
  absl::MutexLock lock(&mu_);
  woken_ = true;
}

void PeriodicWorker::Loop() {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || woken_; };
      mu_.AwaitWithTimeout(absl::Condition(&ready), period_);
      if (stopping_) return;
      woken_ = false;
    }
    tick_();
  }
}

}  // namespace kvpool
