#include "server/master/grpc_service.h"

#include "proto/error_codes.h"

namespace kvpool::master {
namespace {

// Manifest records sent per heartbeat; a segment with more to catch up polls again at once.
constexpr size_t kMaxRecordsPerHeartbeat = 4096;
// Longest a heartbeat is held when there is nothing to send.
constexpr absl::Duration kMaxHeartbeatHold = absl::Seconds(5);

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

PinMode FromProto(v1::PinMode pin) {
  switch (pin) {
    case v1::PIN_SOFT:
      return PinMode::kSoft;
    case v1::PIN_HARD:
      return PinMode::kHard;
    default:
      return PinMode::kNone;
  }
}

void ToProto(const ManifestRecord& record, v1::ManifestRecord* out) {
  out->set_kind(record.kind == ManifestRecord::Kind::kAdd ? v1::ManifestRecord::ADD
                                                          : v1::ManifestRecord::FORGET);
  out->set_key(record.key);
  out->set_offset(record.offset);
  out->set_size(record.size);
  out->set_checksum(record.checksum);
  out->set_pin(static_cast<v1::PinMode>(record.pin));
}

std::vector<PutRef> ToPutRefs(const google::protobuf::RepeatedPtrField<v1::PutEndItem>& items) {
  std::vector<PutRef> puts;
  puts.reserve(items.size());
  for (const v1::PutEndItem& item : items) {
    puts.push_back(PutRef{item.key(), item.put_id(), item.checksum()});
  }
  return puts;
}

std::vector<std::string> ToKeys(const google::protobuf::RepeatedPtrField<std::string>& keys) {
  return std::vector<std::string>(keys.begin(), keys.end());
}

}  // namespace

void MasterGrpcService::FinishWhenDurable(grpc::ServerUnaryReactor* reactor,
                                          ManifestSync::Ticket ticket) {
  master_.manifest_sync().Wait(std::move(ticket),
                               absl::Now() + master_.options().manifest_sync_timeout,
                               [reactor](bool) { reactor->Finish(grpc::Status::OK); });
}

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
  info.restoring = request->manifest_objects() > 0;
  absl::Status status = master_.MountSegment(std::move(info));
  response->set_heartbeat_interval_ms(
      static_cast<uint32_t>(absl::ToInt64Milliseconds(master_.options().heartbeat_interval)));
  response->set_heartbeat_ttl_ms(
      static_cast<uint32_t>(absl::ToInt64Milliseconds(master_.options().segment_ttl)));
  return Finish(context, status);
}

grpc::ServerUnaryReactor* MasterGrpcService::RestoreManifest(
    grpc::CallbackServerContext* context, const v1::RestoreManifestRequest* request,
    v1::RestoreManifestResponse* response) {
  std::vector<ManifestRecord> records;
  records.reserve(request->records_size());
  for (const v1::ManifestRecord& r : request->records()) {
    records.push_back(ManifestRecord{ManifestRecord::Kind::kAdd, r.key(), r.offset(), r.size(),
                                     r.checksum(), FromProto(r.pin())});
  }
  absl::StatusOr<std::vector<std::string>> refused =
      master_.RestoreManifest(request->name(), request->incarnation(), records);
  if (!refused.ok()) return Finish(context, refused.status());
  for (std::string& key : *refused) response->add_refused_keys(std::move(key));
  if (request->done()) {
    return Finish(context, master_.FinishRestore(request->name(), request->incarnation()));
  }
  return Finish(context, absl::OkStatus());
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
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  Master::HeartbeatReply reply = master_.Heartbeat(request->name(), request->incarnation());
  response->set_known(reply.known);
  response->set_drained(reply.drained);
  if (!reply.segment) {
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
  SegmentId segment = *reply.segment;
  uint64_t acked = request->acked_seq();
  auto answer = [this, reactor, response, segment, acked] {
    ManifestSync::Batch batch =
        master_.manifest_sync().Sync(segment, acked, kMaxRecordsPerHeartbeat);
    for (const ManifestRecord& record : batch.records) ToProto(record, response->add_records());
    response->set_last_seq(batch.last_seq);
    reactor->Finish(grpc::Status::OK);
  };
  absl::Duration hold = std::min(absl::Milliseconds(request->wait_ms()), kMaxHeartbeatHold);
  if (hold <= absl::ZeroDuration()) {
    answer();
  } else {
    master_.manifest_sync().Poll(segment, absl::Now() + hold, std::move(answer));
  }
  return reactor;
}

grpc::ServerUnaryReactor* MasterGrpcService::BatchPutStart(
    grpc::CallbackServerContext* context, const v1::BatchPutStartRequest* request,
    v1::BatchPutStartResponse* response) {
  std::vector<uint64_t> sizes(request->sizes().begin(), request->sizes().end());
  PutStartOptions options{.replica_num = request->replica_num(),
                          .pin = FromProto(request->pin()),
                          .preferred_host = request->preferred_host()};
  absl::StatusOr<std::vector<PutStartResult>> results =
      master_.BatchPutStart(ToKeys(request->keys()), sizes, options);
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
  Durable<absl::Status> ended = master_.BatchPutEnd(ToPutRefs(request->items()));
  for (const absl::Status& status : ended.results) SetResult(status, response->add_results());
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  FinishWhenDurable(reactor, std::move(ended.ticket));
  return reactor;
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
  absl::Time now = absl::Now();
  for (const GetResult& result : master_.BatchGetReplicaList(ToKeys(request->keys()))) {
    v1::GetResult* out = response->add_results();
    out->set_code(ToErrorCode(result.status));
    if (!result.status.ok()) {
      out->set_message(std::string(result.status.message()));
      continue;
    }
    out->set_size(result.size);
    out->set_checksum(result.checksum);
    out->set_lease_ttl_ms(static_cast<uint32_t>(
        std::max<int64_t>(0, absl::ToInt64Milliseconds(result.lease_expiry - now))));
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
  Durable<absl::Status> removed = master_.BatchRemove(ToKeys(request->keys()), request->force());
  for (const absl::Status& status : removed.results) SetResult(status, response->add_results());
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  FinishWhenDurable(reactor, std::move(removed.ticket));
  return reactor;
}

grpc::ServerUnaryReactor* MasterGrpcService::RemoveAll(grpc::CallbackServerContext* context,
                                                       const v1::RemoveAllRequest* request,
                                                       v1::RemoveAllResponse* response) {
  Durable<uint64_t> removed = master_.RemoveAll(request->force());
  response->set_removed(removed.results[0]);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  FinishWhenDurable(reactor, std::move(removed.ticket));
  return reactor;
}

grpc::ServerUnaryReactor* MasterGrpcService::DrainSegment(grpc::CallbackServerContext* context,
                                                          const v1::DrainSegmentRequest* request,
                                                          v1::DrainSegmentResponse* response) {
  return Finish(context, master_.DrainSegment(request->name()));
}

grpc::ServerUnaryReactor* MasterGrpcService::GetClusterStatus(
    grpc::CallbackServerContext* context, const v1::GetClusterStatusRequest* request,
    v1::GetClusterStatusResponse* response) {
  ClusterSummary summary = master_.GetClusterSummary();
  response->set_capacity_bytes(summary.capacity_bytes);
  response->set_used_bytes(summary.used_bytes);
  response->set_objects(summary.objects);
  response->set_pending_objects(summary.pending_objects);
  response->set_leased_objects(master_.CountLeased());
  response->set_soft_pinned_objects(summary.soft_pinned);
  response->set_hard_pinned_objects(summary.hard_pinned);
  const MasterCounters& counters = master_.counters();
  response->set_evicted_objects(counters.evicted_objects.load());
  response->set_evicted_bytes(counters.evicted_bytes.load());
  response->set_reclaimed_reservations(counters.reclaimed_reservations.load());
  for (const SegmentSummary& segment : summary.segments) {
    v1::SegmentStatus* out = response->add_segments();
    out->set_name(segment.name);
    out->set_host(segment.host);
    out->set_endpoint(segment.endpoint);
    out->set_capacity_bytes(segment.capacity_bytes);
    out->set_used_bytes(segment.used_bytes);
    out->set_replicas(segment.replicas);
    out->set_state(segment.draining ? "draining"
                   : segment.restoring ? "restoring"
                   : segment.embedded  ? "active (embedded)"
                                       : "active");
    out->set_last_heartbeat_age_ms(
        static_cast<uint64_t>(absl::ToInt64Milliseconds(segment.heartbeat_age)));
  }
  return Finish(context, absl::OkStatus());
}

}  // namespace kvpool::master
