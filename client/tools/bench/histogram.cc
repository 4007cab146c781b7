#include "client/tools/bench/histogram.h"

#include <algorithm>
#include <bit>
#include <cmath>

namespace kvpool::bench {

int Histogram::BucketOf(uint64_t nanos) {
  if (nanos < kSub) return static_cast<int>(nanos);
  int exponent = 63 - std::countl_zero(nanos);  // >= kSubBits
  int shift = exponent - kSubBits;
  uint64_t sub = (nanos >> shift) - kSub;  // 0 .. kSub-1
  return static_cast<int>(kSub + static_cast<uint64_t>(shift) * kSub + sub);
}

uint64_t Histogram::MiddleOf(int index) {
  if (index < static_cast<int>(kSub)) return static_cast<uint64_t>(index);
  int shift = (index - static_cast<int>(kSub)) / static_cast<int>(kSub);
  uint64_t sub = static_cast<uint64_t>(index - static_cast<int>(kSub)) % kSub;
  uint64_t low = (kSub + sub) << shift;
  return low + ((uint64_t{1} << shift) >> 1);
}

void Histogram::Record(uint64_t nanos) {
  ++counts_[BucketOf(nanos)];
  ++count_;
  sum_ += nanos;
  min_ = std::min(min_, nanos);
  max_ = std::max(max_, nanos);
}

void Histogram::Merge(const Histogram& other) {
  for (int i = 0; i < kBuckets; ++i) counts_[i] += other.counts_[i];
  count_ += other.count_;
  sum_ += other.sum_;
  min_ = std::min(min_, other.min_);
  max_ = std::max(max_, other.max_);
}

uint64_t Histogram::Quantile(double q) const {
  if (count_ == 0) return 0;
  // The rank-th smallest observation, 1-based (nearest-rank definition).
  uint64_t rank = static_cast<uint64_t>(std::ceil(std::clamp(q, 0.0, 1.0) * count_));
  rank = std::max<uint64_t>(rank, 1);
  uint64_t seen = 0;
  for (int i = 0; i < kBuckets; ++i) {
    seen += counts_[i];
    if (seen >= rank) return std::clamp(MiddleOf(i), min_, max_);
  }
  return max_;
}

}  // namespace kvpool::bench
