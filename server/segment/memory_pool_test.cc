#include "server/segment/memory_pool.h"

#include <sys/mman.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace kvpool::segment {
namespace {

TEST(MemoryPoolTest, IsZeroedWritableAndSharedThroughItsFd) {
  absl::StatusOr<std::unique_ptr<MemoryPool>> pool = MemoryPool::Create({.size = 1 << 20, .prefault = true, .name = "test"});
  ASSERT_TRUE(pool.ok()) << pool.status();
  MemoryPool& p = **pool;
  EXPECT_EQ(p.size(), 1u << 20);
  EXPECT_EQ(p.data()[12345], 0);
  std::memcpy(p.data() + 100, "hello", 5);
  // A second mapping of the same file sees the same bytes (what a same-host client will do).
  void* other = mmap(nullptr, p.size(), PROT_READ, MAP_SHARED, p.fd(), 0);
  ASSERT_NE(other, MAP_FAILED);
  EXPECT_EQ(std::memcmp(static_cast<char*>(other) + 100, "hello", 5), 0);
  munmap(other, p.size());
}

TEST(MemoryPoolTest, ContainsIsSafeAgainstOverflow) {
  std::unique_ptr<MemoryPool> pool = *MemoryPool::Create({.size = 4096, .prefault = false, .name = "test"});
  EXPECT_TRUE(pool->Contains(0, 4096));
  EXPECT_TRUE(pool->Contains(4096, 0));
  EXPECT_FALSE(pool->Contains(1, 4096));
  EXPECT_FALSE(pool->Contains(4097, 0));
  EXPECT_FALSE(pool->Contains(10, UINT64_MAX - 5));
  EXPECT_FALSE(pool->Contains(UINT64_MAX, 2));
}

TEST(MemoryPoolTest, RefusesSizeZero) {
  EXPECT_EQ(MemoryPool::Create({.size = 0, .name = "test"}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(MemoryPoolTest, HugePagePoolsAreWholeHugePages) {
  absl::StatusOr<std::unique_ptr<MemoryPool>> pool =
      MemoryPool::Create({.size = kHugePageSize + 4096, .hugepages = true, .name = "test"});
  EXPECT_EQ(pool.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(pool.status().message().find("multiple of 2 MiB"), std::string_view::npos)
      << pool.status();
}

TEST(MemoryPoolTest, TooFewHugePagesIsAClearErrorAtStart) {
  int64_t free_pages = FreeHugePages();
  if (free_pages < 0) GTEST_SKIP() << "this kernel reports no HugePages_Free in /proc/meminfo";
  // One page more than the machine has free: the reservation must fail now, not on a write.
  uint64_t size = static_cast<uint64_t>(free_pages + 1) * kHugePageSize;
  absl::StatusOr<std::unique_ptr<MemoryPool>> pool =
      MemoryPool::Create({.size = size, .prefault = true, .hugepages = true, .name = "test"});
  ASSERT_EQ(pool.status().code(), absl::StatusCode::kResourceExhausted) << pool.status();
  EXPECT_NE(pool.status().message().find("huge pages"), std::string_view::npos);
  EXPECT_NE(pool.status().message().find("vm.nr_hugepages"), std::string_view::npos);
  EXPECT_NE(pool.status().message().find(absl::StrCat(free_pages, " free")),
            std::string_view::npos)
      << pool.status();
}

TEST(MemoryPoolTest, HugePagesBackThePoolWhenReserved) {
  if (FreeHugePages() < 2) {
    GTEST_SKIP() << "fewer than 2 free huge pages here (sysctl vm.nr_hugepages=2 or more "
                    "runs this test)";
  }
  int64_t before = FreeHugePages();
  absl::StatusOr<std::unique_ptr<MemoryPool>> pool = MemoryPool::Create(
      {.size = 2 * kHugePageSize, .prefault = true, .hugepages = true, .name = "test"});
  ASSERT_TRUE(pool.ok()) << pool.status();
  MemoryPool& p = **pool;
  EXPECT_TRUE(p.hugepages());
  // Its pages came out of the huge page reserve.
  EXPECT_EQ(FreeHugePages(), before - 2);
  std::memcpy(p.data() + kHugePageSize + 7, "huge", 4);
  void* other = mmap(nullptr, p.size(), PROT_READ, MAP_SHARED, p.fd(), 0);
  ASSERT_NE(other, MAP_FAILED);
  EXPECT_EQ(std::memcmp(static_cast<char*>(other) + kHugePageSize + 7, "huge", 4), 0);
  munmap(other, p.size());
  pool->reset();
  EXPECT_EQ(FreeHugePages(), before);
}

}  // namespace
}  // namespace kvpool::segment
