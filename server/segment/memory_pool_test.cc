#include "server/segment/memory_pool.h"

#include <sys/mman.h>

#include <cstring>

#include "gtest/gtest.h"

namespace kvpool::segment {
namespace {

TEST(MemoryPoolTest, IsZeroedWritableAndSharedThroughItsFd) {
  absl::StatusOr<std::unique_ptr<MemoryPool>> pool = MemoryPool::Create(1 << 20, true, "test");
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
  std::unique_ptr<MemoryPool> pool = *MemoryPool::Create(4096, false, "test");
  EXPECT_TRUE(pool->Contains(0, 4096));
  EXPECT_TRUE(pool->Contains(4096, 0));
  EXPECT_FALSE(pool->Contains(1, 4096));
  EXPECT_FALSE(pool->Contains(4097, 0));
  EXPECT_FALSE(pool->Contains(10, UINT64_MAX - 5));
  EXPECT_FALSE(pool->Contains(UINT64_MAX, 2));
}

TEST(MemoryPoolTest, RefusesSizeZero) {
  EXPECT_EQ(MemoryPool::Create(0, false, "test").status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvpool::segment
