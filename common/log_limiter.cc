#include "common/log_limiter.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace kvpool {

bool LogLimiter::Allow(uint64_t* suppressed) {
  int64_t now = absl::GetCurrentTimeNanos();
  int64_t next = next_ns_.load(std::memory_order_relaxed);
  if (now < next || !next_ns_.compare_exchange_strong(next, now + interval_ns_)) {
    skipped_.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  *suppressed = skipped_.exchange(0, std::memory_order_relaxed);
  return true;
}

std::string SuppressedNote(uint64_t suppressed) {
  return suppressed == 0 ? "" : absl::StrCat(" (", suppressed, " more like it not logged)");
}

}  // namespace kvpool
