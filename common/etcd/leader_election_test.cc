// LeaderElection against a real etcd started by the test: one leader, hand-over on
// resignation, and a leader that fences itself before its lease can run out.

#include "common/etcd/leader_election.h"

#include <signal.h>

#include <atomic>

#include "gtest/gtest.h"
#include "tests/harness/etcd.h"

namespace kvpool::etcd {
namespace {

class LeaderElectionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<kvpool::testing::EtcdServer>> server =
        kvpool::testing::EtcdServer::Start();
    if (absl::IsNotFound(server.status())) GTEST_SKIP() << server.status().message();
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
  }

  std::unique_ptr<LeaderElection> Candidate(const std::string& value,
                                            std::atomic<int>* deposed = nullptr) {
    absl::StatusOr<std::unique_ptr<EtcdClient>> client =
        EtcdClient::Create(server_->endpoint(), absl::Milliseconds(300));
    EXPECT_TRUE(client.ok()) << client.status();
    ElectionOptions options;
    options.prefix = "/kvpool/test";
    options.value = value;
    options.ttl = kTtl;
    options.on_deposed = [deposed] {
      if (deposed != nullptr) deposed->fetch_add(1);
    };
    return std::make_unique<LeaderElection>(std::move(*client), options);
  }

  // Waits (polling, 20 ms) until `done` holds or `timeout` passes.
  static bool WaitFor(const std::function<bool()>& done, absl::Duration timeout) {
    absl::Time deadline = absl::Now() + timeout;
    while (!done()) {
      if (absl::Now() > deadline) return false;
      absl::SleepFor(absl::Milliseconds(20));
    }
    return true;
  }

  static constexpr absl::Duration kTtl = absl::Seconds(2);
  std::unique_ptr<kvpool::testing::EtcdServer> server_;
};

TEST_F(LeaderElectionTest, OneLeaderAndTheOtherFollowsItsResignation) {
  std::unique_ptr<LeaderElection> a = Candidate("a:1");
  std::unique_ptr<LeaderElection> b = Candidate("b:2");
  a->Start();
  ASSERT_TRUE(WaitFor([&] { return a->IsLeader(); }, absl::Seconds(10)));
  b->Start();
  ASSERT_TRUE(WaitFor([&] { return b->state().leader_value == "a:1"; }, absl::Seconds(10)));
  EXPECT_FALSE(b->IsLeader());
  int64_t first_term = a->state().term;
  EXPECT_GT(first_term, 0);
  EXPECT_EQ(b->state().term, first_term);
  absl::StatusOr<std::vector<std::string>> members = a->Members();
  ASSERT_TRUE(members.ok()) << members.status();
  EXPECT_EQ(*members, (std::vector<std::string>{"a:1", "b:2"}));

  // Resigning hands over at once (the watch fires), not after the TTL.
  absl::Time resigned = absl::Now();
  a->Stop();
  EXPECT_FALSE(a->IsLeader());
  ASSERT_TRUE(WaitFor([&] { return b->IsLeader(); }, absl::Seconds(10)));
  EXPECT_LT(absl::Now() - resigned, kTtl);
  EXPECT_GT(b->state().term, first_term);
  EXPECT_EQ(b->state().leader_value, "b:2");
}

TEST_F(LeaderElectionTest, ALeaderCutFromEtcdStopsLeadingBeforeItsLeaseCanExpire) {
  std::atomic<int> deposed{0};
  std::unique_ptr<LeaderElection> a = Candidate("a:1", &deposed);
  a->Start();
  ASSERT_TRUE(WaitFor([&] { return a->IsLeader(); }, absl::Seconds(10)));
  // Let a keep-alive or two go through, then freeze etcd: no keep-alive is answered again.
  absl::SleepFor(absl::Milliseconds(800));
  server_->process()->Signal(SIGSTOP);
  absl::Time cut = absl::Now();
  ASSERT_TRUE(WaitFor([&] { return !a->IsLeader(); }, absl::Seconds(10)));
  absl::Duration led_on = absl::Now() - cut;
  // At most TTL - margin after the last answered keep-alive, which was before the cut: etcd
  // could not have expired the lease yet.
  EXPECT_LT(led_on, kTtl - absl::Milliseconds(300)) << led_on;
  ASSERT_TRUE(WaitFor([&] { return deposed.load() == 1; }, absl::Seconds(10)));
  EXPECT_FALSE(a->state().leader);
  EXPECT_EQ(a->state().deposed, 1u);
  server_->process()->Signal(SIGCONT);
  // Deposed for good: it never leads again (its state is stale), even with etcd back.
  absl::SleepFor(kTtl + absl::Milliseconds(500));
  EXPECT_FALSE(a->IsLeader());
}

TEST_F(LeaderElectionTest, ALeaderWhoseKeyIsTakenStepsDownAndTheStandbyLeads) {
  std::unique_ptr<LeaderElection> a = Candidate("a:1");
  a->Start();
  ASSERT_TRUE(WaitFor([&] { return a->IsLeader(); }, absl::Seconds(10)));
  int64_t first_term = a->state().term;
  std::unique_ptr<LeaderElection> b = Candidate("b:2");
  b->Start();
  ASSERT_TRUE(WaitFor([&] { return b->state().leader_value == "a:1"; }, absl::Seconds(10)));
  // Delete a's leader key behind its back (what a lease expiry does): b takes over, and a
  // notices that the key is no longer its own and steps down.
  absl::StatusOr<std::unique_ptr<EtcdClient>> admin = EtcdClient::Create(server_->endpoint());
  ASSERT_TRUE(admin.ok());
  ASSERT_TRUE((*admin)->Delete("/kvpool/test/leader").ok());
  ASSERT_TRUE(WaitFor([&] { return b->IsLeader(); }, absl::Seconds(10)));
  EXPECT_GT(b->state().term, first_term);
  ASSERT_TRUE(WaitFor([&] { return !a->IsLeader(); }, absl::Seconds(5)));
  EXPECT_EQ(a->state().deposed, 1u);
}

}  // namespace
}  // namespace kvpool::etcd
