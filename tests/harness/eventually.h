#pragma once

#include <functional>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace kvpool::testing {

// Polls `condition` every 50 ms until it holds or `timeout` passes; whether it held (it is
// asked once more at the end).
inline bool Eventually(const std::function<bool()>& condition, absl::Duration timeout) {
  absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    if (condition()) return true;
    absl::SleepFor(absl::Milliseconds(50));
  }
  return condition();
}

}  // namespace kvpool::testing
