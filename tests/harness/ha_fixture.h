#pragma once

// The high-availability fault tests' shared fixture (tests/ha_test.cc on loopback,
// tests/netns_ha_test.cc across simulated hosts): an etcd, three kvpool-master processes
// elected through it, segments and a client that follow the leader, on the hosts a test
// places them; a load of writers of unique keys and verifying readers; a watch of who leads;
// and the fault scenarios, each ending with the same count and verification of every
// acknowledged put.
//
// What each scenario counts and asserts (printed as one "ha FAULT: ..." line):
//   acked_puts, failed_puts          puts acknowledged / refused (a refusal is allowed)
//   reads, failed_reads, wrong_bytes a reader of acknowledged keys (no wrong byte, ever)
//   cached_reads, cached_failed,     a second client that reads a fixed set of keys through
//   cached_slow, longest_cached_read its location cache (slow: over 200 ms)
//   past_deadline                    calls that outlived every deadline the client set (0)
//   longest_write_gap                longest time between two acknowledged puts
//   writes_resumed                   from the fault to the first ack of a put begun after it
//   leaderless                       longest time no master said it led (watched every ~50 ms)
//   two_leaders                      rounds of the watch that proved two leaders at once (0)
// and, after the load stops, lost (acknowledged puts not read back with their bytes) = 0.

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "kvpool/client.h"
#include "tests/harness/cluster.h"
#include "tests/harness/etcd.h"
#include "tests/harness/tcp_proxy.h"

namespace kvpool::testing {

// Where the pool's processes run and with which extra flags.
struct HaPlacement {
  Host etcd;
  std::vector<Host> masters;  // one per master (three)
  std::vector<Host> segments;
  // The masters' gRPC port; 0: a free one of each master's host.
  uint16_t master_port = 0;
  // Each master reaches etcd through a TcpProxy of its own (loopback), which CutFromEtcd
  // cuts; without, the test overrides CutFromEtcd.
  bool etcd_proxies = false;
  std::vector<std::string> master_flags;
  std::vector<std::string> segment_flags;
};

// What a master says of itself.
struct Role {
  std::string role;  // "leader", "standby", or "down" (no answer)
  int64_t term = 0;
  std::string leader;
  absl::Time asked;     // when the call was sent
  absl::Time answered;  // when its answer came back
};

class HaFixture : public ::testing::Test {
 protected:
  static constexpr int kMasters = 3;

  // The leader's etcd lease: KVPOOL_HA_LEASE (e.g. 3s) or `fallback`.
  static absl::Duration LeaseOr(absl::Duration fallback);

  // Starts etcd, the masters (waiting for a leader), the segments and the client. Fatal
  // failures (ASSERT) on error; call with ASSERT_NO_FATAL_FAILURE.
  void StartPool(const HaPlacement& placement, absl::Duration lease);
  void TearDown() override;

  void StartMasterAt(int i);
  // What master `i` says within `timeout` ("down" if it does not answer by then).
  Role RoleOf(int i, absl::Duration timeout = absl::Milliseconds(500));
  // The index of the master that says it leads (-1 if none within `timeout`); a failure if
  // two do at once (see TwoLeaders).
  int WaitForLeader(absl::Duration timeout, int other_than = -1);
  // Whether, within `timeout`, every master names the same leader (a standby learns it from
  // etcd a moment after the election, and says "standby" with no leader until then).
  bool WaitForAllToNameLeader(absl::Duration timeout);
  // Cuts master `i` from etcd alone (clients and segments still reach it).
  virtual void CutFromEtcd(int i);

  // --- The load ---
  void StartLoad();
  void StopLoad();
  size_t Acked();
  // Waits until `more` further puts are acknowledged.
  bool WaitForAcks(size_t more, absl::Duration timeout);
  // The longest time between two acknowledged puts after `since`.
  absl::Duration LongestWriteGap(absl::Time since);
  // From `since` to the first acknowledgement of a put begun after it (writes resumed);
  // waits up to `timeout` for one, else returns InfiniteDuration.
  absl::Duration WritesResumed(absl::Time since, absl::Duration timeout);
  // Every acknowledged put read back with its bytes (a key retried for a while: a new
  // leader's index fills as segments report their manifests). Returns lost keys.
  size_t VerifyAll(size_t* wrong);
  // Prints the counts line and checks no wrong byte, no call past its deadline, never two
  // leaders.
  void Report(const std::string& fault, absl::Time since);
  // The common end of a fault scenario: `more` further acks, the load stopped, Report,
  // VerifyAll (none lost, none wrong).
  void FinishAndVerify(const std::string& fault, absl::Time since, size_t more = 20);

  // --- The scenarios (one test each) ---
  // `resume_bound`: writes must resume within it after the fault.
  void KillNineOfTheLeader(absl::Duration resume_bound);
  void StopTheLeaderPastItsLease(absl::Duration resume_bound);
  void CutTheLeaderFromEtcd(absl::Duration resume_bound);
  void RestartEtcd();
  // KVPOOL_FAILOVER_ROUNDS kill -9s of the leader under load (skipped without it).
  void FailoverLoop();

  HaPlacement placement_;
  absl::Duration lease_;
  std::unique_ptr<EtcdServer> etcd_;
  std::vector<std::unique_ptr<TcpProxy>> etcd_proxies_;
  std::vector<std::string> addresses_;
  std::string master_list_;
  std::vector<MasterProcess> masters_;
  std::vector<SegmentProcess> segments_;
  ClientOptions client_options_;
  std::unique_ptr<Client> client_;         // no location cache: every get asks the leader
  std::unique_ptr<Client> cached_client_;  // reads through its location cache
  std::string key_prefix_ = "ha";

 private:
  void Watch();
  // Whether master `i`'s answer proves two leaders at once. A sweep over the masters is not an
  // instant (an answer can take hundreds of milliseconds on a loaded machine), so two "leader"
  // answers of one sweep prove nothing; what does: a leader of a term older than one already
  // seen, on a call sent after that answer came back, or two masters leading one term.
  bool TwoLeaders(int i, const Role& role);

  std::atomic<bool> stop_{false};
  std::vector<std::thread> threads_;
  absl::Mutex mu_;
  std::vector<std::string> acked_ ABSL_GUARDED_BY(mu_);
  std::vector<absl::Time> ack_times_ ABSL_GUARDED_BY(mu_);
  // When each acknowledged put began (same order).
  std::vector<absl::Time> ack_starts_ ABSL_GUARDED_BY(mu_);
  size_t put_failures_ ABSL_GUARDED_BY(mu_) = 0;
  size_t reads_ ABSL_GUARDED_BY(mu_) = 0;
  size_t read_failures_ ABSL_GUARDED_BY(mu_) = 0;
  size_t wrong_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  size_t cached_reads_ ABSL_GUARDED_BY(mu_) = 0;
  size_t cached_failed_ ABSL_GUARDED_BY(mu_) = 0;
  size_t cached_slow_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Duration longest_cached_read_ ABSL_GUARDED_BY(mu_);
  // Why cached reads failed: the first message of each kind (its first 60 characters), and
  // how often.
  std::map<std::string, size_t> cached_failures_ ABSL_GUARDED_BY(mu_);
  size_t past_deadline_ ABSL_GUARDED_BY(mu_) = 0;
  // The watch: when a leader was last seen, the longest time none was, rounds with two.
  absl::Time leader_seen_ ABSL_GUARDED_BY(mu_);
  absl::Duration leaderless_ ABSL_GUARDED_BY(mu_);
  size_t two_leaders_ ABSL_GUARDED_BY(mu_) = 0;
  // The newest term seen led, by which master, and when that answer came back.
  int64_t newest_term_ ABSL_GUARDED_BY(mu_) = 0;
  int newest_term_master_ ABSL_GUARDED_BY(mu_) = -1;
  absl::Time newest_term_seen_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvpool::testing
