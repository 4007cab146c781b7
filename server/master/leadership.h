#pragma once

// Whether this kvpool-master may serve, and whom to send callers to when it may not.
//
// A single master (no --etcd) always leads, at term 0: today's behaviour. With --etcd, the
// master leads only while its LeaderElection says so (which fences itself on its own lease
// deadline, see common/etcd/leader_election.h); a standby refuses every call but status with
// Unavailable, a message naming the leader, and trailing metadata that clients follow:
// kLeaderMetadataKey (the leader's address, when one is known) and kStandbyMetadataKey (the
// call was not executed, so it is safe to send it elsewhere).
//
// After an election, the new leader serves at once, but its index holds only what segments
// have reported so far (an object of a segment that has not mounted again answers
// OBJECT_NOT_FOUND, never wrong bytes); Settled() turns true once `settle` has passed since
// the election, which readiness (/readyz) waits for. Thread-safe.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/etcd/leader_election.h"
#include "proto/master_locator.h"

namespace kvpool::master {

using ::kvpool::kLeaderMetadataKey;
using ::kvpool::kStandbyMetadataKey;

class Leadership {
 public:
  // A single master: always the leader.
  Leadership() = default;
  // One of several masters; `election` must outlive this. `self` is this master's address.
  Leadership(const etcd::LeaderElection* election, std::string self, absl::Duration settle);

  bool ha() const { return election_ != nullptr; }
  bool IsLeader() const { return election_ == nullptr || election_->IsLeader(); }
  // OK when this master may serve; else Unavailable naming the leader (see above).
  absl::Status Check() const;
  // This master's term while it leads (0 for a single master), else the leader's as last seen.
  int64_t term() const;
  // The leader's address ("" when none is known); this master's own while it leads.
  std::string leader() const;
  const std::string& self() const { return self_; }
  // Leader, and elected at least `settle` ago.
  bool Settled() const;
  // Every master registered in etcd (the leader among them); just this one without etcd.
  std::vector<std::string> Members() const;
  etcd::ElectionState state() const;

  // Called on election (from the election thread).
  void Elected();

 private:
  const etcd::LeaderElection* election_ = nullptr;
  std::string self_;
  absl::Duration settle_;
  std::atomic<int64_t> elected_at_ns_{0};
};

}  // namespace kvpool::master
