// Busy-range reports: coalesced to their bound without losing a byte, checked against the pool.

#include "proto/busy_ranges.h"

#include "gtest/gtest.h"

namespace kvpool::wire {
namespace {

TEST(BusyRangesTest, MergesOverlappingAndTouchingRangesAndDropsEmptyOnes) {
  std::vector<ByteRange> out =
      CoalesceRanges({{300, 100}, {0, 64}, {64, 36}, {350, 100}, {1000, 0}, {2000, 10}}, 8);
  EXPECT_EQ(out, (std::vector<ByteRange>{{0, 100}, {300, 150}, {2000, 10}}));
}

TEST(BusyRangesTest, PastTheBoundTheSmallestGapsAreClosedAndEveryByteStaysCovered) {
  // Gaps: 10 (after 0), 1000 (after 20), 5 (after 1030), 200 (after 1045).
  std::vector<ByteRange> in = {{0, 10}, {20, 10}, {1030, 10}, {1045, 5}, {1250, 50}};
  EXPECT_EQ(CoalesceRanges(in, 3),
            (std::vector<ByteRange>{{0, 30}, {1030, 20}, {1250, 50}}));
  EXPECT_EQ(CoalesceRanges(in, 1), (std::vector<ByteRange>{{0, 1300}}));
  // Many ranges: the result is within the bound and covers every input byte.
  std::vector<ByteRange> many;
  for (uint64_t i = 0; i < 1000; ++i) many.push_back({i * 4096 + (i % 7) * 64, 64 + (i % 5) * 64});
  std::vector<ByteRange> out = CoalesceRanges(many, kMaxBusyRanges);
  ASSERT_LE(out.size(), kMaxBusyRanges);
  for (size_t i = 1; i < out.size(); ++i) EXPECT_GT(out[i].offset, out[i - 1].end());
  for (const ByteRange& r : many) {
    bool covered = false;
    for (const ByteRange& o : out) covered |= o.offset <= r.offset && r.end() <= o.end();
    EXPECT_TRUE(covered) << r.offset;
  }
}

TEST(BusyRangesTest, ReportsOutsideThePoolOrTooLongAreRefused) {
  EXPECT_TRUE(ValidateBusyRanges({}, 1024).ok());
  EXPECT_TRUE(ValidateBusyRanges(std::vector<ByteRange>{{0, 1024}}, 1024).ok());
  EXPECT_FALSE(ValidateBusyRanges(std::vector<ByteRange>{{0, 1025}}, 1024).ok());
  EXPECT_FALSE(ValidateBusyRanges(std::vector<ByteRange>{{1025, 1}}, 1024).ok());
  EXPECT_FALSE(ValidateBusyRanges(std::vector<ByteRange>{{8, 0}}, 1024).ok());
  EXPECT_FALSE(ValidateBusyRanges(std::vector<ByteRange>{{~uint64_t{0}, 2}}, 1024).ok());
  std::vector<ByteRange> too_many(kMaxBusyRanges + 1, ByteRange{0, 1});
  EXPECT_FALSE(ValidateBusyRanges(too_many, 1024).ok());
}

}  // namespace
}  // namespace kvpool::wire
