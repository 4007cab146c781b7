#pragma once

// Which kvpool-master to call when there may be several (high availability, masters elected
// through etcd). The address given to a client, segment or tool is one of:
//
//   host:port                       one master: called as before, nothing is retried here
//   host:port,host:port[,...]       several masters: the leader among them
//   etcd://host:port[,host:port]    the masters registered in etcd (under `etcd_prefix`),
//                                   starting with the one etcd names leader
//
// With several, callers ask Current() for the address to call and report a failed call with
// Failed(): a standby's answer names the leader (LeaderHint), which becomes current at once;
// a master that does not answer is left for the next one. Thread-safe.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/channel.h"
#include "grpcpp/client_context.h"
#include "proto/tls.h"

namespace kvpool {

namespace etcd {
class EtcdClient;
}

// What a standby attaches to its refusal (trailing metadata); see server/master/leadership.h.
inline constexpr char kLeaderMetadataKey[] = "kvpool-leader";
inline constexpr char kStandbyMetadataKey[] = "kvpool-standby";

// The leader a standby named in the answer of `context` ("" if none).
std::string LeaderHint(const grpc::ClientContext& context);
// Whether the answer of `context` came from a standby (the call was not executed).
bool AnsweredByStandby(const grpc::ClientContext& context);

// Checks the syntax of a master address (the three forms above) without dialling anything:
// InvalidArgument naming what is wrong.
absl::Status ValidateMasterAddress(absl::string_view address);

// Where masters elect their leader in etcd unless told otherwise (kvpool-master --etcd-prefix).
inline constexpr char kDefaultEtcdPrefix[] = "/kvpool/default";

class MasterLocator {
 public:
  // InvalidArgument for a malformed address (the message names it).
  static absl::StatusOr<std::unique_ptr<MasterLocator>> Create(
      absl::string_view address, std::string etcd_prefix = kDefaultEtcdPrefix,
      ClientTlsOptions tls = {});
  ~MasterLocator();

  // One fixed master: callers keep their single-master behaviour (no fail-over).
  bool single() const { return etcd_ == nullptr && seeds_.size() == 1; }
  const std::string& spec() const { return spec_; }

  // The master to call now.
  std::string Current() ABSL_LOCKS_EXCLUDED(mu_);
  // A channel to `address`, made once and kept.
  std::shared_ptr<grpc::Channel> Channel(const std::string& address) ABSL_LOCKS_EXCLUDED(mu_);
  // A call to `address` failed; `leader_hint` is the leader a standby named ("" if none).
  void Failed(const std::string& address, const std::string& leader_hint)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Every master known now (the list given, or those registered in etcd).
  std::vector<std::string> Masters() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  MasterLocator() = default;
  // etcd:// only: re-reads the leader and the members (at most every 100 ms).
  void RefreshLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  std::string spec_;
  std::string etcd_prefix_;
  std::vector<std::string> seeds_;
  std::unique_ptr<etcd::EtcdClient> etcd_;

  absl::Mutex mu_;
  std::vector<std::string> masters_ ABSL_GUARDED_BY(mu_);
  std::string current_ ABSL_GUARDED_BY(mu_);
  absl::Time refreshed_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  struct CachedChannel {
    std::shared_ptr<grpc::Channel> channel;
    absl::Time made;
  };
  std::vector<std::pair<std::string, CachedChannel>> channels_ ABSL_GUARDED_BY(mu_);
  // How channels to the masters are made (plaintext when not enabled).
  ClientTlsOptions tls_;
};

}  // namespace kvpool
