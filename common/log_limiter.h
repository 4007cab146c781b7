#pragma once

// At most one log line a second for one kind of event, saying how many were not logged since:
// a flood of bad frames, failed accepts or refused commits costs a counter increment each, not
// a log line. Thread-safe (lock-free); one per kind of event, owned by whoever logs it.
//
//   uint64_t suppressed = 0;
//   if (refusal_log_.Allow(&suppressed)) {
//     KVPOOL_LOG(WARNING) << "refused ..." << SuppressedNote(suppressed);
//   }

#include <atomic>
#include <cstdint>
#include <string>

#include "absl/time/time.h"

namespace kvpool {

class LogLimiter {
 public:
  explicit LogLimiter(absl::Duration interval = absl::Seconds(1))
      : interval_ns_(absl::ToInt64Nanoseconds(interval)) {}

  // True when this event should be logged; `suppressed` is set to how many events were not
  // logged since the last one that was.
  bool Allow(uint64_t* suppressed);

 private:
  const int64_t interval_ns_;
  std::atomic<int64_t> next_ns_{0};
  std::atomic<uint64_t> skipped_{0};
};

// " (N more like it not logged)", or "" for N == 0: the tail of a rate-limited line.
std::string SuppressedNote(uint64_t suppressed);

}  // namespace kvpool
