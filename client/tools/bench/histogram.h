#pragma once

// The latency distribution of one benchmark run: log-linear buckets (64 per power of two,
// about 1.6% resolution) from 1 ns up, in fixed memory (30 KiB) however long the run, so a
// 60-second run uses as much memory as a 1-second one. Not thread-safe: each client thread
// records into its own, and the runner merges them at the end.

#include <array>
#include <cstdint>

namespace kvpool::bench {

class Histogram {
 public:
  void Record(uint64_t nanos);
  void Merge(const Histogram& other);

  uint64_t count() const { return count_; }
  uint64_t min_nanos() const { return count_ == 0 ? 0 : min_; }
  uint64_t max_nanos() const { return max_; }
  double mean_nanos() const { return count_ == 0 ? 0 : static_cast<double>(sum_) / count_; }
  // The value at quantile `q` (0.5, 0.99, 0.999), within a bucket's width; 0 when empty.
  uint64_t Quantile(double q) const;

 private:
  static constexpr int kSubBits = 6;
  static constexpr uint64_t kSub = uint64_t{1} << kSubBits;
  // Values below kSub get a bucket each; above, kSub buckets per power of two up to 2^63.
  static constexpr int kBuckets = static_cast<int>(kSub + (64 - kSubBits) * kSub);

  static int BucketOf(uint64_t nanos);
  // The middle of bucket `index`, clamped to the observed range by Quantile.
  static uint64_t MiddleOf(int index);

  std::array<uint64_t, kBuckets> counts_{};
  uint64_t count_ = 0;
  uint64_t sum_ = 0;
  uint64_t min_ = UINT64_MAX;
  uint64_t max_ = 0;
};

}  // namespace kvpool::bench
