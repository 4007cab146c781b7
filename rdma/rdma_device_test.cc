// Runs on a machine with an RDMA device: a queue pair connected to itself over loopback
// writes and reads registered memory. Elsewhere it says it was skipped, and why.

#include "rdma/rdma_device.h"

#include <cstring>
#include <vector>

#include "gtest/gtest.h"

namespace kvpool::rdma {
namespace {

TEST(RdmaDeviceTest, LoopbackWriteAndReadThroughAQueuePair) {
  absl::StatusOr<std::shared_ptr<Device>> device = Device::Open("");
  if (!device.ok()) {
    std::printf("no RDMA device: %s; RDMA tests skipped\n",
                std::string(device.status().message()).c_str());
    GTEST_SKIP() << "no RDMA device: " << device.status();
  }
  std::vector<uint8_t> pool(1 << 20, 0), local(4096);
  for (size_t i = 0; i < local.size(); ++i) local[i] = static_cast<uint8_t>(i * 13);
  auto pool_mr = (*device)->Register(pool.data(), pool.size(), /*remote=*/true);
  auto local_mr = (*device)->Register(local.data(), local.size(), /*remote=*/false);
  ASSERT_TRUE(pool_mr.ok() && local_mr.ok());
  auto a = (*device)->CreateQueuePair();
  auto b = (*device)->CreateQueuePair();
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE((*a)->Connect((*b)->local()).ok());
  ASSERT_TRUE((*b)->Connect((*a)->local()).ok());
  QueuePair::Sge sge{reinterpret_cast<uint64_t>(local.data()), 4096, (*local_mr)->lkey()};
  uint64_t remote = reinterpret_cast<uint64_t>(pool.data()) + 8192;
  ASSERT_TRUE((*a)->Post(true, &sge, 1, remote, (*pool_mr)->rkey(), 1).ok());
  ASSERT_TRUE((*a)->Wait(1, absl::Now() + absl::Seconds(5)).ok());
  EXPECT_EQ(std::memcmp(pool.data() + 8192, local.data(), 4096), 0);
  std::memset(local.data(), 0, 4096);
  ASSERT_TRUE((*a)->Post(false, &sge, 1, remote, (*pool_mr)->rkey(), 2).ok());
  ASSERT_TRUE((*a)->Wait(1, absl::Now() + absl::Seconds(5)).ok());
  EXPECT_EQ(std::memcmp(pool.data() + 8192, local.data(), 4096), 0);
}

TEST(RdmaDeviceTest, NoDeviceIsAClearUnavailable) {
  absl::StatusOr<std::shared_ptr<Device>> device = Device::Open("no-such-rdma-device-xyz");
  ASSERT_FALSE(device.ok());
  EXPECT_TRUE(device.status().code() == absl::StatusCode::kUnavailable ||
              device.status().code() == absl::StatusCode::kNotFound)
      << device.status();
}

}  // namespace
}  // namespace kvpool::rdma
