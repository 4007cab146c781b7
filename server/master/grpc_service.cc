#include "server/master/grpc_service.h"

#include "proto/error_codes.h"

namespace kvpool::master {
namespace {

grpc::ServerUnaryReactor* Finish(grpc::CallbackServerContext* context, const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

void SetResult(const absl::Status& status, v1::KeyResult* out) {
  out->set_code(ToErrorCode(status));
  if (!status.ok()) out->set_message(std::string(status.message()));
}

void ToProto(const PlacementView& placement, v1::Placement* out) {
  out->set_segment_name(placement.segment_name);
  out->set_endpoint(placement.endpoint);
  out->set_offset(placement.offset);
  out->set_length(placement.length);
  out->set_token(placement.token.data(), placement.token.size());
  out->set_host(placement.host);
}

std::vector<PutRef> ToPutRefs(const google::protobuf::RepeatedPtrField<v1::PutEndItem>& items) {
  std::vector<PutRef> puts;
  puts.reserve(items.size());
  for (const v1::PutEndItem& item : items) puts.push_back(PutRef{item.key(), item.put_id()});
  return puts;
}

std::vector<std::string> ToKeys(const google::protobuf::RepeatedPtrField<std::string>& keys) {
  return std::vector<std::string>(keys.begin(), keys.end());
}

}  // namespace

grpc::ServerUnaryReactor* MasterGrpcService::MountSegment(grpc::CallbackServerContext* context,
                                                          const v1::MountSegmentRequest* request,
                                                          v1::MountSegmentResponse* response) {
  SegmentInfo info;
  info.name = request->name();
  info.host = request->host();
  info.endpoint = request->endpoint();
  info.size = request->size();
  info.incarnation = request->incarnation();
  info.token_secret = request->token_secret();
  absl::Status status = master_.MountSegment(std::move(info));
  response->set_heartbeat_interval_ms(
      static_cast<uint32_t>(absl::ToInt64Milliseconds(master_.options().heartbeat_interval)));
  response->set_heartbeat_ttl_ms(
      static_cast<uint32_t>(absl::ToInt64Milliseconds(master_.options().segment_ttl)));
  return Finish(context, status);
}

grpc::ServerUnaryReactor* MasterGrpcService::UnmountSegment(
    grpc::CallbackServerContext* context, const v1::UnmountSegmentRequest* request,
    v1::UnmountSegmentResponse* response) {
  absl::StatusOr<uint64_t> dropped =
      master_.UnmountSegment(request->name(), request->incarnation());
  if (dropped.ok()) response->set_objects_dropped(*dropped);
  return Finish(context, dropped.status());
}

grpc::ServerUnaryReactor* MasterGrpcService::Heartbeat(grpc::CallbackServerContext* context,
                                                       const v1::HeartbeatRequest* request,
                                                       v1::HeartbeatResponse* response) {
  response->set_known(master_.Heartbeat(request->name(), request->incarnation()));
  return Finish(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* MasterGrpcService::BatchPutStart(
    grpc::CallbackServerContext* context, const v1::BatchPutStartRequest* request,
    v1::BatchPutStartResponse* response) {
  std::vector<uint64_t> sizes(request->sizes().begin(), request->sizes().end());
  absl::StatusOr<std::vector<PutStartResult>> results =
      master_.BatchPutStart(ToKeys(request->keys()), sizes, request->replica_num());
  if (!results.ok()) return Finish(context, results.status());
  for (const PutStartResult& result : *results) {
    v1::PutStartResult* out = response->add_results();
    out->set_code(ToErrorCode(result.status));
    if (!result.status.ok()) out->set_message(std::string(result.status.message()));
    out->set_put_id(result.put_id);
    for (const PlacementView& placement : result.placements) {
      ToProto(placement, out->add_placements());
    }
  }
  return Finish(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* MasterGrpcService::BatchPutEnd(grpc::CallbackServerContext* context,
                                                         const v1::BatchPutEndRequest* request,
                                                         v1::BatchPutEndResponse* response) {
  for (const absl::Status& status : master_.BatchPutEnd(ToPutRefs(request->items()))) {
    SetResult(status, response->add_results());
  }
  return Finish(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* MasterGrpcService::BatchPutRevoke(
    grpc::CallbackServerContext* context, const v1::BatchPutRevokeRequest* request,
    v1::BatchPutRevokeResponse* response) {
  for (const absl::Status& status : master_.BatchPutRevoke(ToPutRefs(request->items()))) {
    SetResult(status, response->add_results());
  }
  return Finish(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* MasterGrpcService::BatchGetReplicaList(
    grpc::CallbackServerContext* context, const v1::BatchGetReplicaListRequest* request,
    v1::BatchGetReplicaListResponse* response) {
  for (const GetResult& result : master_.BatchGetReplicaList(ToKeys(request->keys()))) {
    v1::GetResult* out = response->add_results();
    out->set_code(ToErrorCode(result.status));
    if (!result.status.ok()) out->set_message(std::string(result.status.message()));
    out->set_size(result.size);
    for (const PlacementView& placement : result.replicas) {
      ToProto(placement, out->add_replicas());
    }
  }
  return Finish(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* MasterGrpcService::BatchExist(grpc::CallbackServerContext* context,
                                                        const v1::BatchExistRequest* request,
                                                        v1::BatchExistResponse* response) {
  for (const absl::StatusOr<bool>& exists : master_.BatchExist(ToKeys(request->keys()))) {
    v1::ExistResult* out = response->add_results();
    out->set_code(ToErrorCode(exists.status()));
    out->set_exists(exists.ok() && *exists);
  }
  return Finish(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* MasterGrpcService::BatchRemove(grpc::CallbackServerContext* context,
                                                         const v1::BatchRemoveRequest* request,
                                                         v1::BatchRemoveResponse* response) {
  for (const absl::Status& status : master_.BatchRemove(ToKeys(request->keys()))) {
    SetResult(status, response->add_results());
  }
  return Finish(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* MasterGrpcService::RemoveAll(grpc::CallbackServerContext* context,
                                                       const v1::RemoveAllRequest* request,
                                                       v1::RemoveAllResponse* response) {
  response->set_removed(master_.RemoveAll());
  return Finish(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* MasterGrpcService::GetClusterStatus(
    grpc::CallbackServerContext* context, const v1::GetClusterStatusRequest* request,
    v1::GetClusterStatusResponse* response) {
  ClusterSummary summary = master_.GetClusterSummary();
  response->set_capacity_bytes(summary.capacity_bytes);
  response->set_used_bytes(summary.used_bytes);
  response->set_objects(summary.objects);
  response->set_pending_objects(summary.pending_objects);
  for (const SegmentSummary& segment : summary.segments) {
    v1::SegmentStatus* out = response->add_segments();
    out->set_name(segment.name);
    out->set_host(segment.host);
    out->set_endpoint(segment.endpoint);
    out->set_capacity_bytes(segment.capacity_bytes);
    out->set_used_bytes(segment.used_bytes);
    out->set_replicas(segment.replicas);
    out->set_state(segment.embedded ? "active (embedded)" : "active");
    out->set_last_heartbeat_age_ms(
        static_cast<uint64_t>(absl::ToInt64Milliseconds(segment.heartbeat_age)));
  }
  return Finish(context, absl::OkStatus());
}

}  // namespace kvpool::master
