#include "common/log_limiter.h"

#include <atomic>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace kvpool {
namespace {

TEST(LogLimiterTest, OneEventPerIntervalAndTheRestCounted) {
  LogLimiter limiter(absl::Hours(1));
  uint64_t suppressed = 99;
  EXPECT_TRUE(limiter.Allow(&suppressed));
  EXPECT_EQ(suppressed, 0u);
  for (int i = 0; i < 1000; ++i) EXPECT_FALSE(limiter.Allow(&suppressed));
}

TEST(LogLimiterTest, TheNextLineSaysHowManyWereNotLogged) {
  LogLimiter limiter(absl::Milliseconds(50));
  uint64_t suppressed = 0;
  ASSERT_TRUE(limiter.Allow(&suppressed));
  int skipped = 0;
  while (!limiter.Allow(&suppressed)) ++skipped;
  EXPECT_GT(skipped, 0);
  EXPECT_EQ(suppressed, static_cast<uint64_t>(skipped));
  EXPECT_EQ(SuppressedNote(3), " (3 more like it not logged)");
  EXPECT_EQ(SuppressedNote(0), "");
}

TEST(LogLimiterTest, ManyThreadsAtOnceLogOnce) {
  LogLimiter limiter(absl::Hours(1));
  std::atomic<int> allowed{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      uint64_t suppressed = 0;
      for (int i = 0; i < 10000; ++i) allowed += limiter.Allow(&suppressed) ? 1 : 0;
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(allowed.load(), 1);
}

}  // namespace
}  // namespace kvpool
