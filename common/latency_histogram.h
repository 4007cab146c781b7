#pragma once

// A latency histogram cheap enough for the data path: fixed bucket bounds (10 us to 10 s),
// one relaxed atomic increment per observation, no lock. Exported as a Prometheus histogram
// by the servers and as ClientStats by the client. Thread-safe.

#include <array>
#include <atomic>
#include <cstdint>
#include <vector>

#include "absl/time/time.h"

namespace kvpool {

struct HistogramSnapshot {
  // Upper bounds in seconds; counts[i] observations were <= bounds[i] and > bounds[i-1];
  // counts has one more entry than bounds, for what is above the last bound.
  std::vector<double> bounds;
  std::vector<uint64_t> counts;
  double sum_seconds = 0;
  uint64_t count = 0;
};

class LatencyHistogram {
 public:
  static constexpr std::array<double, 19> kBounds = {
      0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
      0.025,   0.05,     0.1,     0.25,   0.5,     1,      2.5,   5,      10};

  void Observe(absl::Duration elapsed);
  HistogramSnapshot Snapshot() const;

 private:
  std::array<std::atomic<uint64_t>, kBounds.size() + 1> counts_{};
  std::atomic<uint64_t> sum_nanos_{0};
};

}  // namespace kvpool
