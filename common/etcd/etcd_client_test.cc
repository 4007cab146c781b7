// EtcdClient against a real etcd started by the test.

#include "common/etcd/etcd_client.h"

#include <signal.h>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/harness/etcd.h"

namespace kvpool::etcd {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

class EtcdClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<kvpool::testing::EtcdServer>> server =
        kvpool::testing::EtcdServer::Start();
    if (absl::IsNotFound(server.status())) GTEST_SKIP() << server.status().message();
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    absl::StatusOr<std::unique_ptr<EtcdClient>> client = EtcdClient::Create(server_->endpoint());
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = std::move(*client);
  }

  std::unique_ptr<kvpool::testing::EtcdServer> server_;
  std::unique_ptr<EtcdClient> client_;
};

TEST(ParseEndpointsTest, AcceptsListsAndRejectsGarbage) {
  absl::StatusOr<std::vector<std::string>> parsed =
      ParseEndpoints("http://10.0.0.1:2379, 10.0.0.2:2379");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_THAT(*parsed, ElementsAre("10.0.0.1:2379", "10.0.0.2:2379"));
  EXPECT_THAT(ParseEndpoints("").status().message(), HasSubstr("no etcd endpoint"));
  EXPECT_THAT(ParseEndpoints("host-without-port").status().message(), HasSubstr("host:port"));
  EXPECT_FALSE(ParseEndpoints("h:0").ok());
}

TEST_F(EtcdClientTest, CreateIfAbsentCreatesOnceAndTheLeaseOwnsTheKey) {
  absl::StatusOr<Lease> lease = client_->GrantLease(absl::Seconds(5));
  ASSERT_TRUE(lease.ok()) << lease.status();
  EXPECT_NE(lease->id, 0);
  EXPECT_EQ(lease->ttl, absl::Seconds(5));

  absl::StatusOr<CreateResult> first = client_->CreateIfAbsent("/t/leader", "a:1", lease->id);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_TRUE(first->created);
  EXPECT_GT(first->revision, 0);

  absl::StatusOr<CreateResult> second = client_->CreateIfAbsent("/t/leader", "b:2", 0);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_FALSE(second->created);
  ASSERT_TRUE(second->existing.has_value());
  EXPECT_EQ(second->existing->value, "a:1");
  EXPECT_EQ(second->existing->create_revision, first->revision);
  EXPECT_EQ(second->existing->lease, lease->id);

  absl::StatusOr<absl::Duration> renewed = client_->KeepAlive(lease->id);
  ASSERT_TRUE(renewed.ok()) << renewed.status();
  EXPECT_EQ(*renewed, absl::Seconds(5));

  // Revoking the lease deletes the key; a watcher sees it; the lease is gone for good.
  ASSERT_TRUE(client_->RevokeLease(lease->id).ok());
  absl::StatusOr<bool> changed =
      client_->WaitForChange("/t/leader", first->revision, absl::Seconds(5));
  ASSERT_TRUE(changed.ok()) << changed.status();
  EXPECT_TRUE(*changed);
  absl::StatusOr<std::optional<KeyValue>> gone = client_->Get("/t/leader");
  ASSERT_TRUE(gone.ok()) << gone.status();
  EXPECT_FALSE(gone->has_value());
  EXPECT_TRUE(absl::IsNotFound(client_->KeepAlive(lease->id).status()));

  // A later creation has a later revision: the term grows.
  absl::StatusOr<CreateResult> third = client_->CreateIfAbsent("/t/leader", "b:2", 0);
  ASSERT_TRUE(third.ok()) << third.status();
  EXPECT_TRUE(third->created);
  EXPECT_GT(third->revision, first->revision);
}

TEST_F(EtcdClientTest, WatchTimesOutWithoutAChangeAndSeesAPut) {
  ASSERT_TRUE(client_->Put("/t/k", "v1", 0).ok());
  absl::StatusOr<std::optional<KeyValue>> kv = client_->Get("/t/k");
  ASSERT_TRUE(kv.ok() && kv->has_value());
  absl::Time start = absl::Now();
  absl::StatusOr<bool> quiet =
      client_->WaitForChange("/t/k", (*kv)->mod_revision, absl::Milliseconds(300));
  ASSERT_TRUE(quiet.ok()) << quiet.status();
  EXPECT_FALSE(*quiet);
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(250));
  // A change already made before the watch starts is seen (start_revision).
  ASSERT_TRUE(client_->Put("/t/k", "v2", 0).ok());
  absl::StatusOr<bool> changed =
      client_->WaitForChange("/t/k", (*kv)->mod_revision, absl::Seconds(5));
  ASSERT_TRUE(changed.ok()) << changed.status();
  EXPECT_TRUE(*changed);
}

TEST_F(EtcdClientTest, PrefixListsMembersInKeyOrder) {
  ASSERT_TRUE(client_->Put("/p/members/b", "B", 0).ok());
  ASSERT_TRUE(client_->Put("/p/members/a", "A", 0).ok());
  ASSERT_TRUE(client_->Put("/p/other", "X", 0).ok());
  absl::StatusOr<std::vector<KeyValue>> kvs = client_->GetPrefix("/p/members/");
  ASSERT_TRUE(kvs.ok()) << kvs.status();
  ASSERT_EQ(kvs->size(), 2u);
  EXPECT_EQ((*kvs)[0].value, "A");
  EXPECT_EQ((*kvs)[1].value, "B");
  ASSERT_TRUE(client_->Delete("/p/members/a").ok());
  kvs = client_->GetPrefix("/p/members/");
  ASSERT_TRUE(kvs.ok());
  EXPECT_EQ(kvs->size(), 1u);
}

TEST_F(EtcdClientTest, AStoppedEtcdFailsCallsWithinTheirDeadline) {
  server_->process()->Signal(SIGSTOP);
  absl::Time start = absl::Now();
  absl::Status status = client_->Put("/t/k", "v", 0);
  EXPECT_FALSE(status.ok());
  EXPECT_TRUE(absl::IsDeadlineExceeded(status) || absl::IsUnavailable(status)) << status;
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  server_->process()->Signal(SIGCONT);
  EXPECT_TRUE(client_->Put("/t/k", "v", 0).ok());
}

}  // namespace
}  // namespace kvpool::etcd
