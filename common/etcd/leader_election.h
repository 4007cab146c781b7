#pragma once

// Leader election through etcd: any number of candidates, at most one leader at a time.
//
// Each candidate holds an etcd lease of `ttl`, kept alive every ttl/6, and registers itself
// under <prefix>/members/<value>. The leader is the candidate whose transaction created
// <prefix>/leader (value: its address) attached to its lease; its term is the etcd revision
// of that creation, which grows with every election. The others watch the key and campaign
// the moment it is deleted (the leader resigned, or its lease ran out).
//
// A leader fences itself: it counts itself leader only until the time it sent its last
// answered keep-alive plus the TTL etcd granted, less `safety_margin`. etcd cannot expire the
// lease before that (it counts the TTL from when it received the keep-alive, which is later),
// so a leader that cannot reach etcd, or was stopped (SIGSTOP) past its lease, stops being
// leader before anyone else can become one. IsLeader() checks that deadline on a monotonic
// clock at every call, whatever the election thread is doing. Once deposed, a candidate does
// not campaign again (on_deposed says so): its state is stale, a fresh process must stand by.
//
// Thread-safe. One background thread between Start() and Stop().

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/etcd/etcd_client.h"

namespace kvpool::etcd {

struct ElectionOptions {
  // Keys live under this prefix: one election per pool.
  std::string prefix = "/kvpool/default";
  // This candidate's value (the address clients should dial when it leads); unique.
  std::string value;
  absl::Duration ttl = absl::Seconds(3);
  // How long before its lease could run out at etcd the leader stops counting itself leader.
  // Zero: ttl / 6, at least 100 ms.
  absl::Duration safety_margin = absl::ZeroDuration();
  // Called from the election thread when this candidate becomes leader, with its term.
  std::function<void(int64_t term)> on_elected;
  // Called from the election thread once the leader lost (or gave up) its leadership:
  // lease gone, not renewed in time, or its key taken over. Not called by Stop().
  std::function<void()> on_deposed;
};

struct ElectionState {
  bool leader = false;
  // This candidate's term while it leads; else the last term it saw.
  int64_t term = 0;
  // The leader's value as last seen in etcd ("" if none is known).
  std::string leader_value;
  // Elections this candidate won and leaderships it lost.
  uint64_t elected = 0;
  uint64_t deposed = 0;
  // Elections won after seeing another leader (fail-overs), and for the last one, the time
  // from the last moment this candidate saw that leader alive to its own election: an upper
  // bound (by one round, ttl/6) on the time without a leader.
  uint64_t takeovers = 0;
  absl::Duration last_takeover;
  // The last error talking to etcd ("" once a call succeeds again).
  std::string etcd_error;
};

class LeaderElection {
 public:
  LeaderElection(std::unique_ptr<EtcdClient> client, ElectionOptions options);
  ~LeaderElection();
  LeaderElection(const LeaderElection&) = delete;
  LeaderElection& operator=(const LeaderElection&) = delete;

  void Start();
  // Resigns (revokes the lease, so that another candidate takes over at once) and stops.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

  // Leader now: elected, and its own lease deadline not passed.
  bool IsLeader() const;
  ElectionState state() const ABSL_LOCKS_EXCLUDED(mu_);
  // The values of every registered candidate (the leader among them), in key order.
  absl::StatusOr<std::vector<std::string>> Members() const;
  const ElectionOptions& options() const { return options_; }
  std::string leader_key() const { return options_.prefix + "/leader"; }

 private:
  using SteadyTime = std::chrono::steady_clock::time_point;
  void Loop() ABSL_LOCKS_EXCLUDED(mu_);
  // One round: lease, campaign, keep-alive. Returns how long to wait for a change.
  void Round() ABSL_LOCKS_EXCLUDED(mu_);
  void StepDown(const std::string& why) ABSL_LOCKS_EXCLUDED(mu_);
  void NoteEtcd(const absl::Status& status) ABSL_LOCKS_EXCLUDED(mu_);
  // Sleeps (or, as follower, watches the leader key) for up to `timeout`.
  void Wait(absl::Duration timeout) ABSL_LOCKS_EXCLUDED(mu_);

  const std::unique_ptr<EtcdClient> client_;
  const ElectionOptions options_;
  const absl::Duration margin_;
  const absl::Duration interval_;

  // Steady-clock nanoseconds until which this candidate is leader (0: not leader).
  std::atomic<int64_t> leader_until_ns_{0};

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  ElectionState state_ ABSL_GUARDED_BY(mu_);
  // Election thread only.
  Lease lease_;
  bool was_leader_ = false;
  // When a standby last saw another leader's key (0: never).
  int64_t leader_seen_ns_ = 0;
  // Revision of the leader key as last read, for the watch.
  int64_t leader_key_revision_ = 0;
  std::thread thread_;
};

}  // namespace kvpool::etcd
