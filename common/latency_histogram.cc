#include "common/latency_histogram.h"

#include <algorithm>

namespace kvpool {

void LatencyHistogram::Observe(absl::Duration elapsed) {
  double seconds = absl::ToDoubleSeconds(elapsed);
  size_t bucket = std::lower_bound(kBounds.begin(), kBounds.end(), seconds) - kBounds.begin();
  counts_[bucket].fetch_add(1, std::memory_order_relaxed);
  sum_nanos_.fetch_add(static_cast<uint64_t>(std::max<int64_t>(0, absl::ToInt64Nanoseconds(elapsed))),
                       std::memory_order_relaxed);
}

HistogramSnapshot LatencyHistogram::Snapshot() const {
  HistogramSnapshot snapshot;
  snapshot.bounds.assign(kBounds.begin(), kBounds.end());
  for (const std::atomic<uint64_t>& count : counts_) {
    snapshot.counts.push_back(count.load(std::memory_order_relaxed));
    snapshot.count += snapshot.counts.back();
  }
  snapshot.sum_seconds = static_cast<double>(sum_nanos_.load(std::memory_order_relaxed)) / 1e9;
  return snapshot;
}

}  // namespace kvpool
