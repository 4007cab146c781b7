#pragma once

// The client's view of kvpool-master: one typed call per RPC, each with the deadline of
// ClientOptions::rpc_timeout, failures converted to absl::Status (RPC_FAIL when the master
// cannot be reached). Internal to kvpool_client. Thread-safe.
//
// With several masters (a list or etcd://, see proto/master_locator.h) a call goes to the
// leader: a standby's refusal (the call was not executed) sends it on to the leader the
// standby names, or, during an election, to the others again until the deadline; a master
// that does not answer is tried at most once per call (a call whose answer was lost may have
// been executed), and the call fails Unavailable (retryable) once no master is left.

#include <memory>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "kvpool/v1/master.grpc.pb.h"
#include "proto/master_locator.h"
#include "proto/tls.h"

namespace kvpool::client {

class MasterClient {
 public:
  // `locator` was made with the same TLS options (its channels use them); over TLS when
  // tls.enabled() (validate it first: ValidateClientTls); `auth_token`, if not empty, goes
  // with every call (AttachToken).
  MasterClient(std::unique_ptr<MasterLocator> locator, absl::Duration rpc_timeout,
               ClientTlsOptions tls = {}, std::string auth_token = {});

  // Every master known (one without high availability) and the one called now.
  std::vector<std::string> Masters() { return locator_->Masters(); }
  std::string CurrentMaster() { return locator_->Current(); }

  // Waits up to `timeout` for the master to answer (Unavailable if it does not).
  absl::Status WaitForMaster(absl::Duration timeout);

  absl::StatusOr<v1::BatchPutStartResponse> BatchPutStart(const v1::BatchPutStartRequest& request);
  absl::StatusOr<v1::BatchPutEndResponse> BatchPutEnd(const v1::BatchPutEndRequest& request);
  absl::StatusOr<v1::BatchPutRevokeResponse> BatchPutRevoke(
      const v1::BatchPutRevokeRequest& request);
  // Within `timeout` if given (shorter than rpc_timeout: a renewal of cached locations).
  absl::StatusOr<v1::BatchGetReplicaListResponse> BatchGetReplicaList(
      const v1::BatchGetReplicaListRequest& request,
      std::optional<absl::Duration> timeout = std::nullopt);
  absl::StatusOr<v1::BatchExistResponse> BatchExist(const v1::BatchExistRequest& request);
  absl::StatusOr<v1::BatchRemoveResponse> BatchRemove(const v1::BatchRemoveRequest& request);
  absl::StatusOr<v1::BatchDropReplicasResponse> BatchDropReplicas(
      const v1::BatchDropReplicasRequest& request);
  absl::StatusOr<v1::RemoveAllResponse> RemoveAll(const v1::RemoveAllRequest& request);
  absl::StatusOr<v1::GetClusterStatusResponse> GetClusterStatus(
      const v1::GetClusterStatusRequest& request);
  absl::StatusOr<v1::DrainSegmentResponse> DrainSegment(const v1::DrainSegmentRequest& request);
  absl::StatusOr<v1::MigrateStartResponse> MigrateStart(const v1::MigrateStartRequest& request);
  absl::StatusOr<v1::MigrateEndResponse> MigrateEnd(const v1::MigrateEndRequest& request);
  absl::StatusOr<v1::ReplicaCopyStartResponse> ReplicaCopyStart(
      const v1::ReplicaCopyStartRequest& request);
  absl::StatusOr<v1::MigrateEndResponse> ReplicaCopyEnd(const v1::MigrateEndRequest& request);

 private:
  template <typename Request, typename Response>
  using Method = grpc::Status (v1::MasterService::Stub::*)(grpc::ClientContext*, const Request&,
                                                           Response*);

  template <typename Request, typename Response>
  absl::StatusOr<Response> Call(Method<Request, Response> method, const Request& request,
                                absl::Duration timeout, bool wait_for_ready = false);
  // Call() among several masters.
  template <typename Request, typename Response>
  absl::StatusOr<Response> CallLeader(Method<Request, Response> method, const Request& request,
                                      absl::Duration timeout);

  std::shared_ptr<v1::MasterService::Stub> Stub() ABSL_LOCKS_EXCLUDED(mu_);
  // After an Unavailable answer: a fresh channel, which connects at once instead of waiting
  // out the old one's backoff (at most once a second).
  void Reconnect() ABSL_LOCKS_EXCLUDED(mu_);

  const std::unique_ptr<MasterLocator> locator_;
  const std::string address_;
  const absl::Duration rpc_timeout_;
  const ClientTlsOptions tls_;
  const std::string auth_token_;
  absl::Mutex mu_;
  std::shared_ptr<v1::MasterService::Stub> stub_ ABSL_GUARDED_BY(mu_);
  absl::Time reconnected_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

}  // namespace kvpool::client
