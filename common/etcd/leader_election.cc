#include "common/etcd/leader_election.h"

#include "absl/strings/str_cat.h"
#include "common/log.h"

namespace kvpool::etcd {
namespace {

int64_t SteadyNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

absl::Duration Margin(const ElectionOptions& options) {
  if (options.safety_margin > absl::ZeroDuration()) return options.safety_margin;
  return std::max(options.ttl / 6, absl::Milliseconds(100));
}

}  // namespace

LeaderElection::LeaderElection(std::unique_ptr<EtcdClient> client, ElectionOptions options)
    : client_(std::move(client)),
      options_(std::move(options)),
      margin_(Margin(options_)),
      interval_(std::max(options_.ttl / 6, absl::Milliseconds(50))) {}

LeaderElection::~LeaderElection() { Stop(); }

void LeaderElection::Start() { thread_ = std::thread([this] { Loop(); }); }

void LeaderElection::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_ && !thread_.joinable()) return;
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
  bool led = leader_until_ns_.exchange(0) != 0;
  if (lease_.id != 0) {
    // Resigning: the leader key goes with the lease, and a standby takes over at once
    // instead of after the TTL.
    absl::Status revoked = client_->RevokeLease(lease_.id);
    if (led) {
      KVPOOL_LOG(INFO) << "resigned the leadership"
                       << (revoked.ok() ? "" : absl::StrCat(" (revoke failed: ",
                                                            revoked.message(), ")"));
    }
    lease_.id = 0;
  }
  absl::MutexLock lock(&mu_);
  state_.leader = false;
}

bool LeaderElection::IsLeader() const { return SteadyNanos() < leader_until_ns_.load(); }

ElectionState LeaderElection::state() const {
  absl::MutexLock lock(&mu_);
  ElectionState state = state_;
  state.leader = state.leader && IsLeader();
  return state;
}

absl::StatusOr<std::vector<std::string>> LeaderElection::Members() const {
  absl::StatusOr<std::vector<KeyValue>> kvs = client_->GetPrefix(options_.prefix + "/members/");
  if (!kvs.ok()) return kvs.status();
  std::vector<std::string> members;
  for (const KeyValue& kv : *kvs) members.push_back(kv.value);
  return members;
}

void LeaderElection::NoteEtcd(const absl::Status& status) {
  absl::MutexLock lock(&mu_);
  if (status.ok()) {
    if (!state_.etcd_error.empty()) KVPOOL_LOG(INFO) << "etcd answers again";
    state_.etcd_error.clear();
  } else if (state_.etcd_error.empty()) {
    // Once per outage, not once per round.
    KVPOOL_LOG(WARNING) << status.message();
    state_.etcd_error = std::string(status.message());
  }
}

void LeaderElection::StepDown(const std::string& why) {
  leader_until_ns_.store(0);
  was_leader_ = false;
  {
    absl::MutexLock lock(&mu_);
    state_.leader = false;
    ++state_.deposed;
    stopping_ = true;  // a deposed leader does not campaign again
  }
  KVPOOL_LOG(WARNING) << "no longer the leader: " << why;
  if (options_.on_deposed) options_.on_deposed();
}

void LeaderElection::Loop() {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
    }
    Round();
  }
}

void LeaderElection::Round() {
  int64_t sent = SteadyNanos();
  if (lease_.id == 0) {
    absl::StatusOr<Lease> granted = client_->GrantLease(options_.ttl);
    NoteEtcd(granted.status());
    if (!granted.ok()) {
      Wait(interval_);
      return;
    }
    lease_ = *granted;
    // Best effort: only for listing the candidates (kvpoolctl status, etcd:// clients).
    NoteEtcd(client_->Put(options_.prefix + "/members/" + options_.value, options_.value,
                          lease_.id));
  } else {
    absl::StatusOr<absl::Duration> renewed = client_->KeepAlive(lease_.id);
    if (absl::IsNotFound(renewed.status())) {
      NoteEtcd(absl::OkStatus());
      lease_.id = 0;
      if (was_leader_) {
        StepDown("its etcd lease expired");
        return;
      }
      return;  // a new lease next round
    }
    NoteEtcd(renewed.status());
    if (renewed.ok()) lease_.ttl = *renewed;
    if (!renewed.ok()) {
      // No answer: the deadline of the last answered keep-alive stands.
      if (was_leader_ && !IsLeader()) {
        StepDown(absl::StrCat("its lease could not be renewed in time (",
                              renewed.status().message(), ")"));
        return;
      }
      Wait(interval_);
      return;
    }
  }
  int64_t until = sent + absl::ToInt64Nanoseconds(lease_.ttl - margin_);

  if (was_leader_) {
    // Still ours? (An operator may have deleted the key, or etcd restored an older state.)
    absl::StatusOr<std::optional<KeyValue>> current = client_->Get(leader_key());
    NoteEtcd(current.status());
    int64_t term;
    {
      absl::MutexLock lock(&mu_);
      term = state_.term;
    }
    if (current.ok() && (!current->has_value() || (*current)->create_revision != term ||
                         (*current)->lease != lease_.id)) {
      StepDown("the leader key is no longer its own");
      return;
    }
    leader_until_ns_.store(until);
    Wait(interval_);
    return;
  }

  absl::StatusOr<CreateResult> campaign =
      client_->CreateIfAbsent(leader_key(), options_.value, lease_.id);
  NoteEtcd(campaign.status());
  if (!campaign.ok()) {
    Wait(interval_);
    return;
  }
  if (campaign->created) {
    was_leader_ = true;
    leader_until_ns_.store(until);
    {
      absl::MutexLock lock(&mu_);
      state_.leader = true;
      state_.term = campaign->revision;
      state_.leader_value = options_.value;
      ++state_.elected;
      if (leader_seen_ns_ != 0) {
        ++state_.takeovers;
        state_.last_takeover = absl::Nanoseconds(SteadyNanos() - leader_seen_ns_);
      }
    }
    leader_key_revision_ = campaign->revision;
    KVPOOL_LOG(INFO) << "elected leader, term " << campaign->revision;
    if (options_.on_elected) options_.on_elected(campaign->revision);
    Wait(interval_);
    return;
  }
  {
    absl::MutexLock lock(&mu_);
    if (campaign->existing) {
      if (state_.leader_value != campaign->existing->value) {
        KVPOOL_LOG(INFO) << "standing by; the leader is " << campaign->existing->value
                         << " (term " << campaign->existing->create_revision << ")";
      }
      state_.leader_value = campaign->existing->value;
      state_.term = campaign->existing->create_revision;
      leader_seen_ns_ = SteadyNanos();
    } else {
      state_.leader_value.clear();
    }
  }
  leader_key_revision_ =
      campaign->existing ? campaign->existing->mod_revision : campaign->revision;
  Wait(interval_);
}

void LeaderElection::Wait(absl::Duration timeout) {
  if (!was_leader_ && lease_.id != 0) {
    // A standby watches the leader key: it campaigns as soon as the key goes.
    absl::StatusOr<bool> changed =
        client_->WaitForChange(leader_key(), leader_key_revision_, timeout);
    if (changed.ok()) return;
    NoteEtcd(changed.status());
  }
  absl::MutexLock lock(&mu_);
  mu_.AwaitWithTimeout(absl::Condition(&stopping_), timeout);
}

}  // namespace kvpool::etcd
