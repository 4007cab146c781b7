#include "server/master/leadership.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "proto/error_codes.h"

namespace kvpool::master {
namespace {

int64_t SteadyNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

Leadership::Leadership(const etcd::LeaderElection* election, std::string self,
                       absl::Duration settle)
    : election_(election), self_(std::move(self)), settle_(settle) {}

absl::Status Leadership::Check() const {
  if (IsLeader()) return absl::OkStatus();
  etcd::ElectionState state = election_->state();
  std::string where =
      state.leader_value.empty() || state.leader_value == self_
          ? std::string("no leader is known yet (an election is under way); retry shortly")
          : absl::StrCat("the leader is ", state.leader_value, " (term ", state.term, ")");
  return WithErrorCode(absl::UnavailableError(absl::StrCat(
                           "kvpool-master ", self_, " is a standby, not the leader: ", where)),
                       v1::RPC_FAIL);
}

int64_t Leadership::term() const {
  if (election_ == nullptr) return 0;
  return election_->state().term;
}

std::string Leadership::leader() const {
  if (election_ == nullptr) return self_;
  if (election_->IsLeader()) return self_;
  std::string leader = election_->state().leader_value;
  return leader == self_ ? "" : leader;
}

bool Leadership::Settled() const {
  if (election_ == nullptr) return true;
  int64_t elected = elected_at_ns_.load();
  return election_->IsLeader() && elected != 0 &&
         SteadyNanos() - elected >= absl::ToInt64Nanoseconds(settle_);
}

std::vector<std::string> Leadership::Members() const {
  if (election_ == nullptr) return {self_};
  absl::StatusOr<std::vector<std::string>> members = election_->Members();
  if (!members.ok()) return {self_};
  return *members;
}

etcd::ElectionState Leadership::state() const {
  if (election_ == nullptr) return etcd::ElectionState{.leader = true, .leader_value = self_};
  return election_->state();
}

void Leadership::Elected() { elected_at_ns_.store(SteadyNanos()); }

}  // namespace kvpool::master
