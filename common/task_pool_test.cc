#include "common/task_pool.h"

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace kvpool {
namespace {

TEST(TaskPoolTest, RunRunsEveryTaskOnce) {
  TaskPool pool(3);
  std::vector<std::atomic<int>> runs(16);
  std::vector<std::function<void()>> tasks;
  for (size_t i = 0; i < runs.size(); ++i) tasks.push_back([&runs, i] { ++runs[i]; });
  pool.Run(std::move(tasks));
  for (const std::atomic<int>& n : runs) EXPECT_EQ(n.load(), 1);
}

TEST(TaskPoolTest, AsyncReturnsEachResultFromAThreadOfThePool) {
  TaskPool pool(2);
  std::vector<std::future<std::pair<int, std::thread::id>>> futures;
  for (int i = 0; i < 8; ++i) {
    futures.push_back(
        pool.Async([i] { return std::make_pair(i * i, std::this_thread::get_id()); }));
  }
  for (int i = 0; i < 8; ++i) {
    auto [square, thread] = futures[i].get();
    EXPECT_EQ(square, i * i);
    EXPECT_NE(thread, std::this_thread::get_id());
  }
}

TEST(TaskPoolTest, AsyncTakesMoveOnlyStateAndRunsInOrderOnOneThread) {
  TaskPool pool(1);
  std::vector<int> order;
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  // The first task blocks the only thread: the others wait behind it, in order.
  std::future<void> first = pool.Async([released, &order] {
    released.wait();
    order.push_back(0);
  });
  std::vector<std::future<std::string>> rest;
  for (int i = 1; i <= 3; ++i) {
    auto owned = std::make_unique<std::string>(std::to_string(i));
    rest.push_back(pool.Async([owned = std::move(owned), &order, i]() mutable {
      order.push_back(i);
      return *owned;
    }));
  }
  EXPECT_EQ(rest[0].wait_for(std::chrono::milliseconds(20)), std::future_status::timeout);
  release.set_value();
  first.get();
  for (int i = 1; i <= 3; ++i) EXPECT_EQ(rest[i - 1].get(), std::to_string(i));
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3}));
}

TEST(TaskPoolTest, AsyncWithoutThreadsRunsOnTheCaller) {
  TaskPool pool(0);
  std::future<std::thread::id> ran = pool.Async([] { return std::this_thread::get_id(); });
  ASSERT_EQ(ran.wait_for(std::chrono::seconds(0)), std::future_status::ready);
  EXPECT_EQ(ran.get(), std::this_thread::get_id());
}

TEST(TaskPoolTest, DestructionRunsWhatWasHandedOver) {
  std::atomic<int> ran{0};
  {
    TaskPool pool(1);
    for (int i = 0; i < 50; ++i) pool.Async([&ran] { ++ran; });
  }
  EXPECT_EQ(ran.load(), 50);
}

}  // namespace
}  // namespace kvpool
