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

// Busy ranges a segment reports (SetHeld) are never handed out, free or freed later, until a
// report no longer lists them; allocated, free and held bytes never overlap.
TEST(RangeAllocatorTest, HeldRangesAreNeverHandedOutUntilNoLongerReported) {
  RangeAllocator allocator(4096);
  uint64_t a = *allocator.Allocate(1024);  // [0, 1024)
  ASSERT_EQ(a, 0u);
  // Busy: the free [1024, 2048) at once, and [512, 1024) of a once it is freed. Rounded out
  // to the alignment: [1030, 1100) keeps [1024, 1152).
  std::vector<wire::ByteRange> busy = {{512, 512}, {1024, 1024}};
  EXPECT_EQ(allocator.SetHeld(busy), 1024u);
  EXPECT_EQ(allocator.held(), 1024u);
  EXPECT_EQ(allocator.used(), 1024u);
  EXPECT_EQ(allocator.largest_free(), 2048u);
  allocator.Free(a, 1024);
  EXPECT_EQ(allocator.held(), 1536u);
  EXPECT_EQ(allocator.used(), 0u);
  // Everything handed out now lies outside [512, 2048).
  std::vector<uint64_t> got;
  while (std::optional<uint64_t> offset = allocator.Allocate(64)) got.push_back(*offset);
  EXPECT_EQ(got.size(), (4096u - 1536u) / 64u);
  for (uint64_t offset : got) EXPECT_TRUE(offset < 512 || offset >= 2048) << offset;
  // A report without [512, 1024): those bytes serve again; a report without any: all do.
  EXPECT_EQ(allocator.SetHeld(std::vector<wire::ByteRange>{{1024, 1024}}), 1024u);
  EXPECT_EQ(allocator.largest_free(), 512u);
  EXPECT_EQ(*allocator.Allocate(512), 512u);
  EXPECT_EQ(allocator.SetHeld({}), 0u);
  EXPECT_EQ(*allocator.Allocate(1024), 1024u);
  EXPECT_FALSE(allocator.Allocate(64).has_value());
  EXPECT_EQ(allocator.used(), 4096u);
}

TEST(RangeAllocatorTest, HeldRangesAreAlignedClippedAndTheSameReportChangesNothing) {
  RangeAllocator allocator(1024);
  EXPECT_EQ(allocator.SetHeld(std::vector<wire::ByteRange>{{100, 10}}), 64u);  // [64, 128)
  EXPECT_FALSE(allocator.AllocateAt(64, 64));
  EXPECT_TRUE(allocator.AllocateAt(0, 64));
  // Past the end is clipped; overlapping ranges count once.
  EXPECT_EQ(allocator.SetHeld(std::vector<wire::ByteRange>{{960, 1000}, {100, 10}, {64, 64}}),
            128u);
  EXPECT_EQ(allocator.SetHeld(std::vector<wire::ByteRange>{{960, 1000}, {100, 10}, {64, 64}}),
            128u);
  EXPECT_EQ(allocator.used() + allocator.held() + 832u, 1024u);
  EXPECT_EQ(allocator.largest_free(), 832u);  // [128, 960)
  EXPECT_EQ(allocator.SetHeld(std::vector<wire::ByteRange>{{5000, 10}}), 0u);
  EXPECT_EQ(allocator.largest_free(), 960u);
}

// Random allocations, frees and reports: no byte is ever allocated twice or inside a range
// held when it was allocated, and the bytes always add up.
TEST(RangeAllocatorTest, RandomHoldsKeepAllocatedFreeAndHeldApart) {
  constexpr uint64_t kCapacity = 64 * 256;
  RangeAllocator allocator(kCapacity);
  std::mt19937_64 random(7);
  std::vector<std::pair<uint64_t, uint64_t>> live;
  std::vector<wire::ByteRange> held;
  for (int step = 0; step < 20000; ++step) {
    int what = static_cast<int>(random() % 10);
    if (what < 5) {
      uint64_t size = 1 + random() % 700;
      if (std::optional<uint64_t> offset = allocator.Allocate(size)) {
        uint64_t end = *offset + RangeAllocator::Rounded(size);
        for (const auto& [o, s] : live) ASSERT_TRUE(end <= o || o + s <= *offset);
        for (const wire::ByteRange& h : held) {
          uint64_t start = h.offset / 64 * 64;
          uint64_t stop = RangeAllocator::Rounded(h.end());
          ASSERT_TRUE(end <= start || stop <= *offset) << *offset << " in " << h.offset;
        }
        live.emplace_back(*offset, RangeAllocator::Rounded(size));
      }
    } else if (what < 9 && !live.empty()) {
      size_t i = random() % live.size();
      allocator.Free(live[i].first, live[i].second);
      live.erase(live.begin() + static_cast<ptrdiff_t>(i));
    } else {
      held.clear();
      for (int n = static_cast<int>(random() % 4); n > 0; --n) {
        held.push_back({random() % kCapacity, 1 + random() % 2000});
      }
      allocator.SetHeld(held);
    }
    uint64_t used = 0;
    for (const auto& [o, s] : live) used += s;
    ASSERT_EQ(allocator.used(), used);
    ASSERT_LE(allocator.used() + allocator.held(), kCapacity);
  }
  for (const auto& [o, s] : live) allocator.Free(o, s);
  EXPECT_EQ(allocator.SetHeld({}), 0u);
  EXPECT_EQ(allocator.largest_free(), kCapacity);
}

}  // namespace
}  // namespace kvpool::master
