#include "client/master_client.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "proto/channel.h"
#include "proto/error_codes.h"

namespace kvpool::client {

MasterClient::MasterClient(std::unique_ptr<MasterLocator> locator, absl::Duration rpc_timeout,
                           ClientTlsOptions tls, std::string auth_token)
    : locator_(std::move(locator)),
      address_(locator_->spec()),
      rpc_timeout_(rpc_timeout),
      tls_(std::move(tls)),
      auth_token_(std::move(auth_token)),
      stub_(locator_->single() ? v1::MasterService::NewStub(MakeMasterChannel(address_, tls_))
                               : nullptr) {}

std::shared_ptr<v1::MasterService::Stub> MasterClient::Stub() {
  absl::MutexLock lock(&mu_);
  return stub_;
}

void MasterClient::Reconnect() {
  absl::MutexLock lock(&mu_);
  if (absl::Now() - reconnected_ < absl::Seconds(1)) return;
  reconnected_ = absl::Now();
  stub_ = v1::MasterService::NewStub(MakeMasterChannel(address_, tls_));
}

template <typename Request, typename Response>
absl::StatusOr<Response> MasterClient::Call(Method<Request, Response> method,
                                            const Request& request, absl::Duration timeout,
                                            bool wait_for_ready) {
  if (!locator_->single()) return CallLeader(method, request, timeout);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  context.set_wait_for_ready(wait_for_ready);
  AttachToken(context, auth_token_);
  Response response;
  grpc::Status status = (Stub().get()->*method)(&context, request, &response);
  if (status.error_code() == grpc::StatusCode::UNAVAILABLE) Reconnect();
  if (!status.ok()) return FromGrpcStatus(status);
  return response;
}

template <typename Request, typename Response>
absl::StatusOr<Response> MasterClient::CallLeader(Method<Request, Response> method,
                                                  const Request& request,
                                                  absl::Duration timeout) {
  absl::Time deadline = absl::Now() + timeout;
  // Masters that failed this call without a standby's answer: not sent it again.
  std::vector<std::string> unanswered;
  grpc::Status last(grpc::StatusCode::UNAVAILABLE, "no kvpool-master known");
  while (absl::Now() < deadline) {
    std::string address = locator_->Current();
    if (std::find(unanswered.begin(), unanswered.end(), address) != unanswered.end()) {
      // Every master the locator offers has failed once: try one not yet failed, if any.
      std::string untried;
      for (const std::string& master : locator_->Masters()) {
        if (std::find(unanswered.begin(), unanswered.end(), master) == unanswered.end()) {
          untried = master;
          break;
        }
      }
      if (untried.empty()) break;
      address = untried;
    }
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(deadline));
    AttachToken(context, auth_token_);
    Response response;
    std::unique_ptr<v1::MasterService::Stub> stub =
        v1::MasterService::NewStub(locator_->Channel(address));
    last = (stub.get()->*method)(&context, request, &response);
    if (last.ok()) return response;
    if (last.error_code() != grpc::StatusCode::UNAVAILABLE &&
        last.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED) {
      break;
    }
    std::string leader = LeaderHint(context);
    locator_->Failed(address, leader);
    if (AnsweredByStandby(context)) {
      // Not executed: safe to send on. Without a leader named, an election is under way.
      if (leader.empty() || leader == address) absl::SleepFor(absl::Milliseconds(50));
      continue;
    }
    unanswered.push_back(address);
  }
  if (last.ok()) last = grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "no leader in time");
  return WithErrorCode(FromGrpcStatus(last), v1::RPC_FAIL);
}

absl::Status MasterClient::WaitForMaster(absl::Duration timeout) {
  absl::StatusOr<v1::GetClusterStatusResponse> status = Call(
      &v1::MasterService::Stub::GetClusterStatus, v1::GetClusterStatusRequest(), timeout, true);
  if (status.ok()) return absl::OkStatus();
  // The master answered, and refused these credentials: say so, not "no master".
  if (absl::IsUnauthenticated(status.status()) || absl::IsPermissionDenied(status.status())) {
    return status.status();
  }
  if (!locator_->single()) {
    // Several masters: any one that answers will do (a standby answers status too), given a
    // few rounds while they start.
    absl::Time deadline = absl::Now() + timeout;
    while (absl::Now() < deadline && !status.ok()) {
      absl::SleepFor(absl::Milliseconds(100));
      status = CallLeader(&v1::MasterService::Stub::GetClusterStatus,
                          v1::GetClusterStatusRequest(),
                          std::min(rpc_timeout_, deadline - absl::Now()));
      if (absl::IsUnauthenticated(status.status()) ||
          absl::IsPermissionDenied(status.status())) {
        return status.status();
      }
    }
    if (status.ok()) return absl::OkStatus();
  }
  return WithErrorCode(absl::UnavailableError(absl::StrCat("no kvpool-master answered at ",
                                                           address_, " within ", absl::FormatDuration(timeout), ": ",
                                                           status.status().message())),
                       v1::RPC_FAIL);
}

absl::StatusOr<v1::BatchPutStartResponse> MasterClient::BatchPutStart(
    const v1::BatchPutStartRequest& request) {
  return Call(&v1::MasterService::Stub::BatchPutStart, request, rpc_timeout_);
}

absl::StatusOr<v1::BatchPutEndResponse> MasterClient::BatchPutEnd(
    const v1::BatchPutEndRequest& request) {
  return Call(&v1::MasterService::Stub::BatchPutEnd, request, rpc_timeout_);
}

absl::StatusOr<v1::BatchPutRevokeResponse> MasterClient::BatchPutRevoke(
    const v1::BatchPutRevokeRequest& request) {
  return Call(&v1::MasterService::Stub::BatchPutRevoke, request, rpc_timeout_);
}

absl::StatusOr<v1::BatchGetReplicaListResponse> MasterClient::BatchGetReplicaList(
    const v1::BatchGetReplicaListRequest& request, std::optional<absl::Duration> timeout) {
  return Call(&v1::MasterService::Stub::BatchGetReplicaList, request,
              std::min(rpc_timeout_, timeout.value_or(rpc_timeout_)));
}

absl::StatusOr<v1::BatchExistResponse> MasterClient::BatchExist(
    const v1::BatchExistRequest& request) {
  return Call(&v1::MasterService::Stub::BatchExist, request, rpc_timeout_);
}

absl::StatusOr<v1::BatchRemoveResponse> MasterClient::BatchRemove(
    const v1::BatchRemoveRequest& request) {
  return Call(&v1::MasterService::Stub::BatchRemove, request, rpc_timeout_);
}

absl::StatusOr<v1::BatchDropReplicasResponse> MasterClient::BatchDropReplicas(
    const v1::BatchDropReplicasRequest& request) {
  return Call(&v1::MasterService::Stub::BatchDropReplicas, request, rpc_timeout_);
}

absl::StatusOr<v1::RemoveAllResponse> MasterClient::RemoveAll(const v1::RemoveAllRequest& request) {
  return Call(&v1::MasterService::Stub::RemoveAll, request, rpc_timeout_);
}

absl::StatusOr<v1::GetClusterStatusResponse> MasterClient::GetClusterStatus(
    const v1::GetClusterStatusRequest& request) {
  absl::StatusOr<v1::GetClusterStatusResponse> status =
      Call(&v1::MasterService::Stub::GetClusterStatus, request, rpc_timeout_);
  // A standby answers status too; the leader's answer is the one wanted, when it gives one.
  if (status.ok() && !locator_->single() && status->role() == "standby" &&
      !status->leader().empty() && status->leader() != status->self()) {
    locator_->Failed(status->self(), status->leader());
    absl::StatusOr<v1::GetClusterStatusResponse> leader =
        Call(&v1::MasterService::Stub::GetClusterStatus, request, rpc_timeout_);
    if (leader.ok() && leader->role() == "leader") return leader;
  }
  return status;
}

absl::StatusOr<v1::DrainSegmentResponse> MasterClient::DrainSegment(
    const v1::DrainSegmentRequest& request) {
  return Call(&v1::MasterService::Stub::DrainSegment, request, rpc_timeout_);
}

absl::StatusOr<v1::MigrateStartResponse> MasterClient::MigrateStart(
    const v1::MigrateStartRequest& request) {
  return Call(&v1::MasterService::Stub::MigrateStart, request, rpc_timeout_);
}

absl::StatusOr<v1::MigrateEndResponse> MasterClient::MigrateEnd(
    const v1::MigrateEndRequest& request) {
  return Call(&v1::MasterService::Stub::MigrateEnd, request, rpc_timeout_);
}

absl::StatusOr<v1::ReplicaCopyStartResponse> MasterClient::ReplicaCopyStart(
    const v1::ReplicaCopyStartRequest& request) {
  return Call(&v1::MasterService::Stub::ReplicaCopyStart, request, rpc_timeout_);
}

absl::StatusOr<v1::MigrateEndResponse> MasterClient::ReplicaCopyEnd(
    const v1::MigrateEndRequest& request) {
  return Call(&v1::MasterService::Stub::ReplicaCopyEnd, request, rpc_timeout_);
}

}  // namespace kvpool::client
