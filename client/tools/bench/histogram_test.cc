#include "client/tools/bench/histogram.h"

#include <cstdint>
#include <random>

#include "gtest/gtest.h"

namespace kvpool::bench {
namespace {

TEST(HistogramTest, EmptyAnswersZero) {
  Histogram histogram;
  EXPECT_EQ(histogram.count(), 0u);
  EXPECT_EQ(histogram.Quantile(0.5), 0u);
  EXPECT_EQ(histogram.mean_nanos(), 0);
}

TEST(HistogramTest, SmallValuesAreExact) {
  Histogram histogram;
  for (uint64_t v = 1; v <= 50; ++v) histogram.Record(v);
  EXPECT_EQ(histogram.Quantile(0.5), 25u);
  EXPECT_EQ(histogram.Quantile(1.0), 50u);
  EXPECT_EQ(histogram.Quantile(0.0), 1u);
}

TEST(HistogramTest, QuantilesWithinTwoPercent) {
  Histogram histogram;
  // 1 us .. 100 ms, uniformly.
  for (uint64_t v = 1; v <= 100000; ++v) histogram.Record(v * 1000);
  for (double q : {0.5, 0.9, 0.99, 0.999}) {
    double expected = q * 100000 * 1000;
    double got = static_cast<double>(histogram.Quantile(q));
    EXPECT_NEAR(got, expected, expected * 0.02) << "q=" << q;
  }
  EXPECT_EQ(histogram.max_nanos(), 100000u * 1000);
  EXPECT_EQ(histogram.min_nanos(), 1000u);
  EXPECT_NEAR(histogram.mean_nanos(), 50000.5 * 1000, 1);
}

TEST(HistogramTest, MergeEqualsRecordingEverything) {
  Histogram a, b, all;
  std::mt19937_64 random(7);
  for (int i = 0; i < 10000; ++i) {
    uint64_t v = random() % 10'000'000;
    (i % 2 ? a : b).Record(v);
    all.Record(v);
  }
  a.Merge(b);
  EXPECT_EQ(a.count(), all.count());
  for (double q : {0.5, 0.99, 0.999}) EXPECT_EQ(a.Quantile(q), all.Quantile(q));
  EXPECT_EQ(a.max_nanos(), all.max_nanos());
}

TEST(HistogramTest, HugeValuesDoNotOverflow) {
  Histogram histogram;
  histogram.Record(UINT64_MAX / 2);
  histogram.Record(uint64_t{1} << 62);
  EXPECT_GE(histogram.Quantile(1.0), uint64_t{1} << 62);
}

}  // namespace
}  // namespace kvpool::bench
