// High availability across hosts: etcd, each of three kvpool-master processes and each of
// two kvpool-segment processes on a simulated host of its own (a network namespace with its
// own address on a bridge, tests/harness/netns.h), the test's clients on another. Servers
// bind their host's non-loopback address (with --insecure: no TLS or tokens here, see
// docs/testing.md), advertise it, and every control-plane and data-plane byte crosses the
// bridge over TCP (the segments offer no shared memory). The faults of ha_test (the shared
// scenarios of tests/harness/ha_fixture.h) with the lease of the target, 3 s, and
// writes resuming within 5 s; cuts are blackhole routes, so a cut is silent (packets
// dropped), not a closed connection as through ha_test's proxies. And one fault only hosts
// can make: a segment cut from every master but not from clients.

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/harness/ha_fixture.h"
#include "tests/harness/netns.h"

namespace kvpool {
namespace {

using testing::HaFixture;
using testing::VirtualNetwork;

// The hosts, made once for the whole binary while it has one thread (the namespace the
// test process moves into is the client's host).
VirtualNetwork* network = nullptr;
std::string* skip_reason = nullptr;

class Hosts : public ::testing::Environment {
 public:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<VirtualNetwork>> made =
        VirtualNetwork::Create({"etcd", "m0", "m1", "m2", "s0", "s1"});
    if (absl::IsFailedPrecondition(made.status())) {
      skip_reason = new std::string(made.status().message());
      return;
    }
    ASSERT_TRUE(made.ok()) << made.status();
    network_ = std::move(*made);
    network = network_.get();
  }
  void TearDown() override {
    network = nullptr;
    network_.reset();
  }

 private:
  std::unique_ptr<VirtualNetwork> network_;
};

const ::testing::Environment* const kHosts = ::testing::AddGlobalTestEnvironment(new Hosts);

// A segment missing heartbeats this long is declared dead (short, for the segment cut).
constexpr absl::Duration kSegmentTtl = absl::Seconds(4);
// The targets: lease 3 s, writes resume within 5 s of the fault.
constexpr absl::Duration kLease = absl::Seconds(3);
constexpr absl::Duration kResume = absl::Seconds(5);

class NetnsHaTest : public HaFixture {
 protected:
  void SetUp() override {
    if (skip_reason != nullptr) {
      GTEST_SKIP() << "network namespaces cannot be made here: " << *skip_reason;
    }
    ASSERT_NE(network, nullptr);
    key_prefix_ = "netns";
    testing::HaPlacement placement;
    placement.etcd = network->host("etcd");
    for (int i = 0; i < kMasters; ++i) {
      placement.masters.push_back(network->host(absl::StrCat("m", i)));
    }
    placement.segments = {network->host("s0"), network->host("s1")};
    placement.master_port = 50051;
    placement.master_flags = {"--insecure",
                              absl::StrCat("--segment-ttl=", absl::FormatDuration(kSegmentTtl))};
    placement.segment_flags = {"--insecure", "--shm-socket=none"};
    ASSERT_NO_FATAL_FAILURE(StartPool(placement, LeaseOr(kLease)));
  }

  // The hosts outlive the test: the cuts it left in place are healed when it ends, so that
  // the next test starts on a whole network.
  void TearDown() override {
    HaFixture::TearDown();
    if (network != nullptr) {
      EXPECT_TRUE(network->HealAll().ok());
    }
  }

  void CutFromEtcd(int i) override { ASSERT_TRUE(network->Cut("etcd", absl::StrCat("m", i)).ok()); }
};

TEST_F(NetnsHaTest, ServersListenOnTheirHostsAddresses) {
  int leader = WaitForLeader(absl::Seconds(10));
  ASSERT_GE(leader, 0);
  absl::StatusOr<ClusterStatus> status = client_->GetClusterStatus();
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->leader, absl::StrCat(network->host(absl::StrCat("m", leader)).address,
                                         ":50051"));
  ASSERT_EQ(status->segments.size(), 2u);
  for (size_t s = 0; s < segments_.size(); ++s) {
    // Each segment's data plane is on its own host's address, and that is what clients dial.
    std::string host = network->host(absl::StrCat("s", s)).address;
    EXPECT_EQ(segments_[s].data.rfind(host + ":", 0), 0u) << segments_[s].data;
    EXPECT_EQ(segments_[s].shm, "none");
  }
  ASSERT_TRUE(client_->Put("netns-one", "across hosts").ok());
  absl::StatusOr<std::string> got = client_->Get("netns-one");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "across hosts");
}

TEST_F(NetnsHaTest, KillNineOfTheLeaderLosesNoAcknowledgedPut) { KillNineOfTheLeader(kResume); }

// A stopped leader does not refuse: calls sent to it before the stop wait out their deadline
// (the client's rpc_timeout, 5 s) before they try the next master, so writes resume within
// that deadline plus the 5 s target, not within the target alone.
TEST_F(NetnsHaTest, ALeaderStoppedPastItsLeaseStepsDownAndServesNothing) {
  StopTheLeaderPastItsLease(client_options_.rpc_timeout + kResume);
}

TEST_F(NetnsHaTest, ALeaderCutFromEtcdButNotFromClientsStepsDownBeforeItsLeaseEnds) {
  CutTheLeaderFromEtcd(kResume);
}

TEST_F(NetnsHaTest, EtcdRestartedLosesNothingAndALeaderServesAgain) { RestartEtcd(); }

// The segment keeps serving clients but hears from no master: its puts cannot be made
// durable (refused, never acknowledged), the leader declares it dead after the segment TTL
// and places on the other segment, reads of its objects fail with an error (never wrong
// bytes) until it mounts again after the heal and reports its manifest: then every
// acknowledged put, on it too, reads back.
TEST_F(NetnsHaTest, ASegmentCutFromTheMastersButNotFromClientsLosesNothing) {
  ASSERT_GE(WaitForLeader(absl::Seconds(10)), 0);
  ASSERT_NO_FATAL_FAILURE(StartLoad());
  ASSERT_TRUE(WaitForAcks(30, absl::Seconds(30)));
  absl::Time cut = absl::Now();
  for (int i = 0; i < kMasters; ++i) {
    ASSERT_TRUE(network->Cut("s0", absl::StrCat("m", i)).ok());
  }
  // Writes go on (on s1), before and after s0 is declared dead.
  ASSERT_TRUE(WaitForAcks(20, absl::Seconds(30))) << "writes stopped while s0 was cut";
  absl::SleepFor(cut + kSegmentTtl + absl::Seconds(2) - absl::Now());
  ASSERT_TRUE(WaitForAcks(20, absl::Seconds(30))) << "writes stopped once s0 was dead";
  std::printf("ha segment cut: longest write gap during the cut %s\n",
              absl::FormatDuration(LongestWriteGap(cut)).c_str());
  for (int i = 0; i < kMasters; ++i) {
    ASSERT_TRUE(network->Heal("s0", absl::StrCat("m", i)).ok());
  }
  absl::StatusOr<std::string> mounted =
      segments_[0].process->WaitForLine("kvpool-segment mounted", absl::Seconds(30));
  ASSERT_TRUE(mounted.ok()) << "s0 did not mount again: " << mounted.status();
  FinishAndVerify("segment cut from the masters", cut);
}

TEST_F(NetnsHaTest, FailoverLoop) { FailoverLoop(); }

}  // namespace
}  // namespace kvpool
