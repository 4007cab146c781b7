#pragma once

// A ReadyEvent that becomes ready when Notify() is called (or at once, if constructed ready).
// Thread-safe.

#include "absl/synchronization/notification.h"
#include "engine_plugin/ready_event.h"

namespace kvpool::engine {

class NotifiedReadyEvent : public ReadyEvent {
 public:
  explicit NotifiedReadyEvent(bool ready = false) {
    if (ready) notification_.Notify();
  }
  // Call at most once.
  void Notify() { notification_.Notify(); }
  bool HasBeenNotified() const { return notification_.HasBeenNotified(); }
  absl::Status Wait() override {
    notification_.WaitForNotification();
    return absl::OkStatus();
  }

 private:
  absl::Notification notification_;
};

}  // namespace kvpool::engine
