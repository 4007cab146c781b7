#include "server/master/range_allocator.h"

#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace kvpool::master {
namespace {

TEST(RangeAllocatorTest, AllocatesAlignedDisjointRangesUntilFull) {
  RangeAllocator allocator(1024);
  std::vector<uint64_t> offsets;
  for (int i = 0; i < 16; ++i) {
    std::optional<uint64_t> offset = allocator.Allocate(1 + i % 64);
    ASSERT_TRUE(offset.has_value()) << i;
    EXPECT_EQ(*offset % RangeAllocator::kAlignment, 0u);
    offsets.push_back(*offset);
  }
  EXPECT_EQ(allocator.used(), 1024u);
  EXPECT_FALSE(allocator.Allocate(1).has_value());
  std::sort(offsets.begin(), offsets.end());
  for (size_t i = 0; i < offsets.size(); ++i) EXPECT_EQ(offsets[i], i * 64);
}

TEST(RangeAllocatorTest, RejectsWhatCannotFitAndBestFits) {
  RangeAllocator allocator(4096);
  EXPECT_FALSE(allocator.Allocate(4097).has_value());
  uint64_t a = *allocator.Allocate(1024);
  uint64_t b = *allocator.Allocate(64);
  uint64_t c = *allocator.Allocate(1024);
  (void)c;
  allocator.Free(a, 1024);
  allocator.Free(b, 64);  // merges with a: one 1088-byte hole, then a 1984-byte tail
  EXPECT_EQ(allocator.largest_free(), 1984u);
  // 1088 fits the hole exactly: best fit takes it, leaving the tail whole.
  EXPECT_EQ(*allocator.Allocate(1088), 0u);
  EXPECT_EQ(allocator.largest_free(), 1984u);
}

TEST(RangeAllocatorTest, FreeMergesNeighboursBackIntoOneRange) {
  RangeAllocator allocator(64 * 100);
  std::vector<uint64_t> offsets;
  for (int i = 0; i < 100; ++i) offsets.push_back(*allocator.Allocate(64));
  std::mt19937 rng(7);
  std::shuffle(offsets.begin(), offsets.end(), rng);
  for (uint64_t offset : offsets) allocator.Free(offset, 64);
  EXPECT_EQ(allocator.used(), 0u);
  EXPECT_EQ(allocator.largest_free(), 6400u);
}

TEST(RangeAllocatorTest, RandomWorkloadNeverOverlaps) {
  RangeAllocator allocator(1 << 20);
  std::mt19937 rng(42);
  std::map<uint64_t, uint64_t> live;  // offset -> rounded size
  for (int step = 0; step < 20000; ++step) {
    if (live.empty() || rng() % 3 != 0) {
      uint64_t size = 1 + rng() % 20000;
      std::optional<uint64_t> offset = allocator.Allocate(size);
      if (!offset) continue;
      uint64_t rounded = RangeAllocator::Rounded(size);
      auto next = live.lower_bound(*offset);
      ASSERT_TRUE(next == live.end() || next->first >= *offset + rounded);
      if (next != live.begin()) {
        auto prev = std::prev(next);
        ASSERT_LE(prev->first + prev->second, *offset);
      }
      live[*offset] = rounded;
    } else {
      auto it = live.begin();
      std::advance(it, rng() % live.size());
      allocator.Free(it->first, it->second);
      live.erase(it);
    }
  }
  uint64_t used = 0;
  for (const auto& [offset, size] : live) used += size;
  EXPECT_EQ(allocator.used(), used);
}

}  // namespace
}  // namespace kvpool::master
