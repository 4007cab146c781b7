#include "common/latency_histogram.h"

#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace kvpool {
namespace {

TEST(LatencyHistogramTest, CountsIntoTheRightBucketsAndSums) {
  LatencyHistogram histogram;
  histogram.Observe(absl::Microseconds(5));     // <= 10 us
  histogram.Observe(absl::Microseconds(10));    // <= 10 us (bounds are inclusive)
  histogram.Observe(absl::Milliseconds(3));     // <= 5 ms
  histogram.Observe(absl::Seconds(60));         // above every bound
  HistogramSnapshot snapshot = histogram.Snapshot();
  ASSERT_EQ(snapshot.counts.size(), snapshot.bounds.size() + 1);
  EXPECT_EQ(snapshot.count, 4u);
  EXPECT_EQ(snapshot.counts[0], 2u);
  EXPECT_EQ(snapshot.counts[8], 1u);  // bound 0.005
  EXPECT_EQ(snapshot.bounds[8], 0.005);
  EXPECT_EQ(snapshot.counts.back(), 1u);
  EXPECT_NEAR(snapshot.sum_seconds, 60.003015, 1e-9);
}

TEST(LatencyHistogramTest, ConcurrentObservationsAreAllCounted) {
  LatencyHistogram histogram;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 10000; ++i) histogram.Observe(absl::Microseconds(100));
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(histogram.Snapshot().count, 40000u);
}

}  // namespace
}  // namespace kvpool
