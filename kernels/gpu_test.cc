// GPU tests of kernels/ (ctest label "gpu"): every kernel against its CPU reference on random
// data. Skipped, with a message, where no CUDA device is present.

#include <gtest/gtest.h>

#include "kernels/testing/gpu_checks.h"

namespace kvpool::kernels::testing {
namespace {

void ExpectAllPass(const std::vector<CheckResult>& results) {
  ASSERT_FALSE(results.empty());
  for (const CheckResult& r : results) EXPECT_TRUE(r.ok) << r.name << ": " << r.detail;
}

class GpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device present; GPU tests skipped";
  }
};

TEST_F(GpuTest, BlockCopyMatchesReference) { ExpectAllPass(CheckBlockCopy(1)); }
TEST_F(GpuTest, GqaDecodeMatchesReference) { ExpectAllPass(CheckGqaDecode(2)); }
TEST_F(GpuTest, MlaDecodeMatchesReference) { ExpectAllPass(CheckMlaDecode(3)); }

}  // namespace
}  // namespace kvpool::kernels::testing
