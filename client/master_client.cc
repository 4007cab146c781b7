#include "client/master_client.h"

#include "absl/strings/str_cat.h"
#include "proto/channel.h"
#include "proto/error_codes.h"

namespace kvpool::client {

MasterClient::MasterClient(const std::string& address, absl::Duration rpc_timeout,
                           ClientTlsOptions tls, std::string auth_token)
    : address_(address),
      rpc_timeout_(rpc_timeout),
      tls_(std::move(tls)),
      auth_token_(std::move(auth_token)),
      stub_(v1::MasterService::NewStub(MakeMasterChannel(address, tls_))) {}

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

absl::Status MasterClient::WaitForMaster(absl::Duration timeout) {
  absl::StatusOr<v1::GetClusterStatusResponse> status = Call(
      &v1::MasterService::Stub::GetClusterStatus, v1::GetClusterStatusRequest(), timeout, true);
  if (status.ok()) return absl::OkStatus();
  // The master answered, and refused these credentials: say so, not "no master".
  if (absl::IsUnauthenticated(status.status()) || absl::IsPermissionDenied(status.status())) {
    return status.status();
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
    const v1::BatchGetReplicaListRequest& request) {
  return Call(&v1::MasterService::Stub::BatchGetReplicaList, request, rpc_timeout_);
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
  return Call(&v1::MasterService::Stub::GetClusterStatus, request, rpc_timeout_);
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

}  // namespace kvpool::client
