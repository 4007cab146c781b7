#include "server/master/grpc_service.h"

#include <memory>
#include <optional>
#include <string_view>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "proto/busy_ranges.h"
#include "proto/error_codes.h"
#include "server/master/tenant_keys.h"

namespace kvpool::master {
namespace {

// Manifest records sent per heartbeat; a segment with more to catch up polls again at once.
constexpr size_t kMaxRecordsPerHeartbeat = 4096;
// HeartbeatRequest.keys_read (segment::Manifest::kMaxReadsNoted).
constexpr int kMaxKeysReadPerHeartbeat = 1024;
// Longest a heartbeat is held when there is nothing to send.
constexpr absl::Duration kMaxHeartbeatHold = absl::Seconds(5);

// A segment's busy-range report; past the bound only one more range is taken, for the
// check to refuse the report (MountedSegment::ReportBusy) without copying all of it.
std::vector<wire::ByteRange> BusyRanges(
    const google::protobuf::RepeatedPtrField<v1::ByteRange>& ranges) {
  std::vector<wire::ByteRange> out;
  out.reserve(std::min<size_t>(ranges.size(), wire::kMaxBusyRanges + 1));
  for (const v1::ByteRange& range : ranges) {
    if (out.size() > wire::kMaxBusyRanges) break;
    out.push_back({range.offset(), range.length()});
  }
  return out;
}

void SetResult(const absl::Status& status, v1::KeyResult* out) {
  out->set_code(ToErrorCode(status));
  if (!status.ok()) out->set_message(std::string(status.message()));
}

std::vector<int32_t> Codes(absl::Span<const absl::Status> statuses) {
  std::vector<int32_t> codes;
  codes.reserve(statuses.size());
  for (const absl::Status& status : statuses) codes.push_back(ToErrorCode(status));
  return codes;
}

// The codes a batch call's response answers (for calls whose codes change while they wait).
std::vector<int32_t> Codes(const google::protobuf::RepeatedPtrField<v1::KeyResult>& results) {
  std::vector<int32_t> codes;
  codes.reserve(results.size());
  for (const v1::KeyResult& result : results) codes.push_back(result.code());
  return codes;
}

void ToProto(const PlacementView& placement, v1::Placement* out) {
  out->set_segment_name(placement.segment_name);
  out->set_endpoint(placement.endpoint);
  out->set_offset(placement.offset);
  out->set_length(placement.length);
  if (placement.token) out->set_token(placement.token->data(), placement.token->size());
  out->set_host(placement.host);
  out->set_incarnation(placement.incarnation);
}

// The segment table of a compact BatchGetReplicaList answer (compact_placements): the first
// replica on a segment adds it to response->segments, every replica names it by index. The
// placements it is given must outlive it (it keys on their segment names, copying none).
class SegmentTable {
 public:
  explicit SegmentTable(v1::BatchGetReplicaListResponse* response) : response_(response) {}

  void Add(const PlacementView& placement, v1::CompactPlacement* out) {
    auto [it, added] = index_.try_emplace(
        std::make_pair(std::string_view(placement.segment_name), placement.incarnation),
        static_cast<uint32_t>(response_->segments_size()));
    if (added) {
      v1::SegmentRef* segment = response_->add_segments();
      segment->set_name(placement.segment_name);
      segment->set_endpoint(placement.endpoint);
      segment->set_host(placement.host);
      segment->set_incarnation(placement.incarnation);
    }
    out->set_segment(it->second);
    out->set_offset(placement.offset);
    out->set_length(placement.length);
    if (placement.token) out->set_token(placement.token->data(), placement.token->size());
  }

 private:
  v1::BatchGetReplicaListResponse* response_;
  // (segment name, incarnation) -> index in response_->segments.
  absl::flat_hash_map<std::pair<std::string_view, uint64_t>, uint32_t> index_;
};

void ToProto(const SegmentSummary& segment, v1::SegmentStatus* out) {
  out->set_name(segment.name);
  out->set_host(segment.host);
  out->set_endpoint(segment.endpoint);
  out->set_shm_socket(segment.shm_socket);
  out->set_machine_id(segment.machine_id);
  out->set_capacity_bytes(segment.capacity_bytes);
  out->set_used_bytes(segment.used_bytes);
  out->set_busy_bytes(segment.busy_bytes);
  out->set_replicas(segment.replicas);
  out->set_state(segment.draining ? "draining"
                 : segment.restoring ? "restoring"
                 : segment.embedded  ? "active (embedded)"
                                     : "active");
  out->set_last_heartbeat_age_ms(
      static_cast<uint64_t>(absl::ToInt64Milliseconds(segment.heartbeat_age)));
  if (segment.key_read_credential.has_value()) {
    out->set_key_read_credential(segment.key_read_credential->data(),
                                 segment.key_read_credential->size());
    out->set_key_read_expiry_ms(static_cast<uint64_t>(absl::ToUnixMillis(segment.key_read_expiry)));
  }
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
  out->set_grant(record.grant);
  out->set_until_ms(static_cast<uint64_t>(std::max<int64_t>(0, absl::ToUnixMillis(record.until))));
}

// Who calls: the peer's host ("ipv4:127.0.0.1:5000" -> "ipv4:127.0.0.1"), the same across
// the client's reconnections; a reservation is tied to it.
std::string Caller(const grpc::CallbackServerContext* context) {
  std::string peer = context->peer();
  if (size_t colon = peer.rfind(':'); colon != std::string::npos &&
                                      (peer.starts_with("ipv4:") || peer.starts_with("ipv6:"))) {
    peer.resize(colon);
  }
  return peer;
}

// The refs of a commit or revoke, with their keys in `identity`'s namespace.
absl::StatusOr<std::vector<PutRef>> ToPutRefs(
    const google::protobuf::RepeatedPtrField<v1::PutEndItem>& items, const std::string& caller,
    const Identity& identity) {
  std::vector<std::string> keys;
  keys.reserve(items.size());
  for (const v1::PutEndItem& item : items) keys.push_back(item.key());
  if (absl::Status scoped = ScopeKeys(identity, keys); !scoped.ok()) return scoped;
  std::vector<PutRef> puts;
  puts.reserve(items.size());
  for (int i = 0; i < items.size(); ++i) {
    puts.push_back(PutRef{std::move(keys[i]), items[i].put_id(), items[i].checksum(), caller});
  }
  return puts;
}

std::vector<std::string> ToKeys(const google::protobuf::RepeatedPtrField<std::string>& keys) {
  return std::vector<std::string>(keys.begin(), keys.end());
}

}  // namespace

// One call in progress: finishing it answers the client and records it in the metrics.
class MasterGrpcService::Call {
 public:
  Call(MasterMetrics& metrics, Rpc rpc, grpc::CallbackServerContext* context)
      : metrics_(&metrics), rpc_(rpc), reactor_(context->DefaultReactor()), start_(absl::Now()) {}

  grpc::ServerUnaryReactor* Finish(const absl::Status& status) const {
    metrics_->RecordCall(rpc_, status.ok(), absl::Now() - start_);
    reactor_->Finish(ToGrpcStatus(status));
    return reactor_;
  }
  grpc::ServerUnaryReactor* reactor() const { return reactor_; }

 private:
  MasterMetrics* metrics_;
  Rpc rpc_;
  grpc::ServerUnaryReactor* reactor_;
  absl::Time start_;
};

grpc::ServerUnaryReactor* MasterGrpcService::RefuseUnlessLeader(
    const Call& call, grpc::CallbackServerContext* context) const {
  if (leadership_ == nullptr || leadership_->IsLeader()) return nullptr;
  context->AddTrailingMetadata(kStandbyMetadataKey, "1");
  if (std::string leader = leadership_->leader(); !leader.empty()) {
    context->AddTrailingMetadata(kLeaderMetadataKey, leader);
  }
  return call.Finish(leadership_->Check());
}

grpc::ServerUnaryReactor* MasterGrpcService::FinishWhenDurable(
    const Call& call, ManifestSync::Ticket ticket, std::function<absl::Status()> not_durable,
    std::function<void()> durable_too) {
  master_.manifest_sync().Wait(
      std::move(ticket), absl::Now() + master_.options().manifest_sync_timeout,
      [call, not_durable = std::move(not_durable),
       durable_too = std::move(durable_too)](bool durable) {
        absl::Status finish = absl::OkStatus();
        if (!durable && not_durable) finish = not_durable();
        if (durable && durable_too) durable_too();
        call.Finish(finish);
      });
  return call.reactor();
}

grpc::ServerUnaryReactor* MasterGrpcService::MountSegment(grpc::CallbackServerContext* context,
                                                          const v1::MountSegmentRequest* request,
                                                          v1::MountSegmentResponse* response) {
  Call call(metrics_, Rpc::kMountSegment, context);
  absl::StatusOr<Identity> caller = auth_.Admit(*context, Rpc::kMountSegment, request->name());
  if (!caller.ok()) return call.Finish(caller.status());
  if (grpc::ServerUnaryReactor* refused = RefuseUnlessLeader(call, context)) return refused;
  SegmentInfo info;
  info.name = request->name();
  info.host = request->host();
  info.endpoint = request->endpoint();
  info.size = request->size();
  info.incarnation = request->incarnation();
  info.token_secret = request->token_secret();
  info.shm_socket = request->shm_socket();
  info.machine_id = request->machine_id();
  info.restoring = request->manifest_objects() > 0;
  info.busy = BusyRanges(request->busy_ranges());
  absl::Status status = master_.MountSegment(std::move(info));
  response->set_heartbeat_interval_ms(
      static_cast<uint32_t>(absl::ToInt64Milliseconds(master_.options().heartbeat_interval)));
  response->set_heartbeat_ttl_ms(
      static_cast<uint32_t>(absl::ToInt64Milliseconds(master_.options().segment_ttl)));
  response->set_term(leadership_ != nullptr ? leadership_->term() : 0);
  return call.Finish(status);
}

grpc::ServerUnaryReactor* MasterGrpcService::RestoreManifest(
    grpc::CallbackServerContext* context, const v1::RestoreManifestRequest* request,
    v1::RestoreManifestResponse* response) {
  Call call(metrics_, Rpc::kRestoreManifest, context);
  absl::StatusOr<Identity> caller = auth_.Admit(*context, Rpc::kRestoreManifest, request->name());
  if (!caller.ok()) return call.Finish(caller.status());
  if (grpc::ServerUnaryReactor* refused = RefuseUnlessLeader(call, context)) return refused;
  std::vector<ManifestRecord> records;
  records.reserve(request->records_size());
  for (const v1::ManifestRecord& r : request->records()) {
    records.push_back(ManifestRecord{ManifestRecord::Kind::kAdd, r.key(), r.offset(), r.size(),
                                     r.checksum(), FromProto(r.pin())});
  }
  absl::StatusOr<std::vector<std::string>> refused =
      master_.RestoreManifest(request->name(), request->incarnation(), records);
  if (!refused.ok()) return call.Finish(refused.status());
  for (std::string& key : *refused) response->add_refused_keys(std::move(key));
  if (request->done()) {
    return call.Finish(master_.FinishRestore(request->name(), request->incarnation()));
  }
  return call.Finish(absl::OkStatus());
}

grpc::ServerUnaryReactor* MasterGrpcService::UnmountSegment(
    grpc::CallbackServerContext* context, const v1::UnmountSegmentRequest* request,
    v1::UnmountSegmentResponse* response) {
  Call call(metrics_, Rpc::kUnmountSegment, context);
  absl::StatusOr<Identity> caller = auth_.Admit(*context, Rpc::kUnmountSegment, request->name());
  if (!caller.ok()) return call.Finish(caller.status());
  if (grpc::ServerUnaryReactor* refused = RefuseUnlessLeader(call, context)) return refused;
  absl::StatusOr<uint64_t> dropped =
      master_.UnmountSegment(request->name(), request->incarnation());
  if (dropped.ok()) response->set_objects_dropped(*dropped);
  return call.Finish(dropped.status());
}

grpc::ServerUnaryReactor* MasterGrpcService::Heartbeat(grpc::CallbackServerContext* context,
                                                       const v1::HeartbeatRequest* request,
                                                       v1::HeartbeatResponse* response) {
  Call call(metrics_, Rpc::kHeartbeat, context);
  absl::StatusOr<Identity> caller = auth_.Admit(*context, Rpc::kHeartbeat, request->name());
  if (!caller.ok()) return call.Finish(caller.status());
  if (grpc::ServerUnaryReactor* refused = RefuseUnlessLeader(call, context)) return refused;
  Master::HeartbeatReply reply = master_.Heartbeat(request->name(), request->incarnation());
  response->set_known(reply.known);
  response->set_drained(reply.drained);
  response->set_term(leadership_ != nullptr ? leadership_->term() : 0);
  if (!reply.segment) return call.Finish(absl::OkStatus());
  SegmentId segment = *reply.segment;
  // Before the acknowledgements below free anything: a range whose FORGET this heartbeat
  // acknowledges while a late shared-memory write holds it stays out of the allocator.
  if (absl::Status busy = master_.ReportBusyRanges(segment, BusyRanges(request->busy_ranges()));
      !busy.ok() && !absl::IsNotFound(busy)) {
    return call.Finish(busy);
  }
  if (request->keys_read_size() > kMaxKeysReadPerHeartbeat) {
    return call.Finish(absl::InvalidArgumentError(
        absl::StrCat("a heartbeat names ", request->keys_read_size(), " keys read (at most ",
                     kMaxKeysReadPerHeartbeat, ")")));
  }
  master_.TouchKeys(
      segment, std::vector<std::string>(request->keys_read().begin(), request->keys_read().end()));
  // What the segment applied is acknowledged now (its waiters released), and a poll that
  // finds nothing newer parks: were they acknowledged only in the answer, every
  // acknowledgement would cost another round trip, answered at once and empty.
  uint64_t acked = request->acked_seq();
  std::vector<uint64_t> refused(request->refused_seqs().begin(), request->refused_seqs().end());
  master_.manifest_sync().Sync(segment, acked, /*max_records=*/0, refused);
  auto answer = [this, call, context, response, segment, acked] {
    // Held across a step-down: a deposed leader hands out no more records.
    if (RefuseUnlessLeader(call, context) != nullptr) return;
    ManifestSync::Batch batch =
        master_.manifest_sync().Sync(segment, acked, kMaxRecordsPerHeartbeat);
    for (const ManifestRecord& record : batch.records) ToProto(record, response->add_records());
    response->set_last_seq(batch.last_seq);
    call.Finish(absl::OkStatus());
  };
  absl::Duration hold = std::min(absl::Milliseconds(request->wait_ms()), kMaxHeartbeatHold);
  if (hold <= absl::ZeroDuration()) {
    answer();
  } else {
    master_.manifest_sync().Poll(segment, absl::Now() + hold, std::move(answer));
  }
  return call.reactor();
}

grpc::ServerUnaryReactor* MasterGrpcService::BatchPutStart(
    grpc::CallbackServerContext* context, const v1::BatchPutStartRequest* request,
    v1::BatchPutStartResponse* response) {
  Call call(metrics_, Rpc::kBatchPutStart, context);
  absl::StatusOr<Identity> caller = auth_.Admit(*context, Rpc::kBatchPutStart, {});
  if (!caller.ok()) return call.Finish(caller.status());
  if (grpc::ServerUnaryReactor* refused = RefuseUnlessLeader(call, context)) return refused;
  std::vector<uint64_t> sizes(request->sizes().begin(), request->sizes().end());
  PutStartOptions options{.replica_num = request->replica_num(),
                          .pin = FromProto(request->pin()),
                          .preferred_host = request->preferred_host(),
                          .preferred_machine_id = request->preferred_machine_id(),
                          .preferred_segments = ToKeys(request->preferred_segments()),
                          .owner = Caller(context)};
  std::vector<std::string> keys = ToKeys(request->keys());
  if (absl::Status scoped = ScopeKeys(*caller, keys); !scoped.ok()) return call.Finish(scoped);
  absl::StatusOr<std::vector<PutStartResult>> results =
      master_.BatchPutStart(keys, sizes, options);
  if (!results.ok()) return call.Finish(results.status());
  // Again before placements leave: a leader stopped inside this handler (SIGSTOP, a long
  // pause) past its lease would otherwise hand out ranges its successor may have reused, and
  // shared-memory writes are not fenced at the segment (docs/semantics.md). What it reserved
  // is never answered and expires. This narrows the window to the send itself; it does not
  // close it.
  if (grpc::ServerUnaryReactor* refused = RefuseUnlessLeader(call, context)) return refused;
  std::vector<int32_t> codes;
  for (const PutStartResult& result : *results) {
    codes.push_back(ToErrorCode(result.status));
    v1::PutStartResult* out = response->add_results();
    out->set_code(ToErrorCode(result.status));
    if (!result.status.ok()) out->set_message(std::string(result.status.message()));
    out->set_put_id(result.put_id);
    if (result.status.ok()) out->set_deadline_unix_ms(absl::ToUnixMillis(result.deadline));
    for (const PlacementView& placement : result.placements) {
      ToProto(placement, out->add_placements());
    }
  }
  metrics_.RecordKeyCodes(Rpc::kBatchPutStart, codes);
  return call.Finish(absl::OkStatus());
}

grpc::ServerUnaryReactor* MasterGrpcService::BatchPutEnd(grpc::CallbackServerContext* context,
                                                         const v1::BatchPutEndRequest* request,
                                                         v1::BatchPutEndResponse* response) {
  Call call(metrics_, Rpc::kBatchPutEnd, context);
  absl::StatusOr<Identity> caller = auth_.Admit(*context, Rpc::kBatchPutEnd, {});
  if (!caller.ok()) return call.Finish(caller.status());
  if (grpc::ServerUnaryReactor* refused = RefuseUnlessLeader(call, context)) return refused;
  absl::StatusOr<std::vector<PutRef>> puts = ToPutRefs(request->items(), Caller(context), *caller);
  if (!puts.ok()) return call.Finish(puts.status());
  Durable<absl::Status> ended = master_.BatchPutEnd(*puts);
  for (const absl::Status& status : ended.results) SetResult(status, response->add_results());
  // A commit is acknowledged only once every segment holding a replica has recorded it in
  // its manifest; else it is WRITE_FAIL (retryable: BatchPutEnd again with the same put_id).
  // A segment that refused it (its range does not hold the checksum's bytes) makes it
  // CHECKSUM_MISMATCH. The metrics count each key under the code it is finally answered.
  auto refused = [response, refusals = ended.refusals] {
    absl::MutexLock lock(&refusals->mu);
    for (const auto& [index, status] : refusals->by_index) {
      SetResult(status, response->mutable_results(static_cast<int>(index)));
    }
  };
  auto record = [this, response] {
    metrics_.RecordKeyCodes(Rpc::kBatchPutEnd, Codes(response->results()));
  };
  auto durable = [refused, record] {
    refused();
    record();
  };
  auto not_durable = [response, refused, record] {
    refused();
    for (v1::KeyResult& result : *response->mutable_results()) {
      if (result.code() == v1::OK) {
        result.set_code(v1::WRITE_FAIL);
        result.set_message(
            "committed, but not yet durable: a segment holding a replica did not record it in "
            "time (control path cut or segment gone); retry BatchPutEnd with the same put_id");
      }
    }
    record();
    return absl::OkStatus();
  };
  return FinishWhenDurable(call, std::move(ended.ticket), std::move(not_durable),
                           std::move(durable));
}

grpc::ServerUnaryReactor* MasterGrpcService::BatchPutRevoke(
    grpc::CallbackServerContext* context, const v1::BatchPutRevokeRequest* request,
    v1::BatchPutRevokeResponse* response) {
  Call call(metrics_, Rpc::kBatchPutRevoke, context);
  absl::StatusOr<Identity> caller = auth_.Admit(*context, Rpc::kBatchPutRevoke, {});
  if (!caller.ok()) return call.Finish(caller.status());
  if (grpc::ServerUnaryReactor* refused = RefuseUnlessLeader(call, context)) return refused;
  absl::StatusOr<std::vector<PutRef>> puts = ToPutRefs(request->items(), Caller(context), *caller);
  if (!puts.ok()) return call.Finish(puts.status());
  std::vector<absl::Status> revoked = master_.BatchPutRevoke(*puts);
  for (const absl::Status& status : revoked) SetResult(status, response->add_results());
  metrics_.RecordKeyCodes(Rpc::kBatchPutRevoke, Codes(revoked));
  return call.Finish(absl::OkStatus());
}

grpc::ServerUnaryReactor* MasterGrpcService::BatchGetReplicaList(
    grpc::CallbackServerContext* context, const v1::BatchGetReplicaListRequest* request,
    v1::BatchGetReplicaListResponse* response) {
  Call call(metrics_, Rpc::kBatchGetReplicaList, context);
  absl::StatusOr<Identity> caller = auth_.Admit(*context, Rpc::kBatchGetReplicaList, {});
  if (!caller.ok()) return call.Finish(caller.status());
  if (grpc::ServerUnaryReactor* refused = RefuseUnlessLeader(call, context)) return refused;
  absl::Time now = absl::Now();
  std::vector<std::string> keys = ToKeys(request->keys());
  if (absl::Status scoped = ScopeKeys(*caller, keys); !scoped.ok()) return call.Finish(scoped);
  const std::vector<GetResult> results = master_.BatchGetReplicaList(
      keys, request->without_tokens() ? ReadTokens::kLeftOut : ReadTokens::kMinted);
  std::vector<int32_t> codes;
  codes.reserve(results.size());
  response->mutable_results()->Reserve(static_cast<int>(results.size()));
  std::optional<SegmentTable> table;
  if (request->compact_placements()) table.emplace(response);
  for (const GetResult& result : results) {
    codes.push_back(ToErrorCode(result.status));
    v1::GetResult* out = response->add_results();
    out->set_code(codes.back());
    if (!result.status.ok()) {
      out->set_message(std::string(result.status.message()));
      continue;
    }
    out->set_size(result.size);
    out->set_checksum(result.checksum);
    out->set_lease_ttl_ms(static_cast<uint32_t>(
        std::max<int64_t>(0, absl::ToInt64Milliseconds(result.lease_expiry - now))));
    for (const PlacementView& placement : result.replicas) {
      if (table) {
        table->Add(placement, out->add_compact_replicas());
      } else {
        ToProto(placement, out->add_replicas());
      }
    }
  }
  metrics_.RecordKeyCodes(Rpc::kBatchGetReplicaList, codes);
  return call.Finish(absl::OkStatus());
}

grpc::ServerUnaryReactor* MasterGrpcService::BatchExist(grpc::CallbackServerContext* context,
                                                        const v1::BatchExistRequest* request,
                                                        v1::BatchExistResponse* response) {
  Call call(metrics_, Rpc::kBatchExist, context);
  absl::StatusOr<Identity> caller = auth_.Admit(*context, Rpc::kBatchExist, {});
  if (!caller.ok()) return call.Finish(caller.status());
  if (grpc::ServerUnaryReactor* refused = RefuseUnlessLeader(call, context)) return refused;
  std::vector<int32_t> codes;
  std::vector<std::string> keys = ToKeys(request->keys());
  if (absl::Status scoped = ScopeKeys(*caller, keys); !scoped.ok()) return call.Finish(scoped);
  for (const absl::StatusOr<bool>& exists : master_.BatchExist(keys)) {
    v1::ExistResult* out = response->add_results();
    out->set_code(ToErrorCode(exists.status()));
    out->set_exists(exists.ok() && *exists);
    // Counted as a lookup: OK when the key exists, OBJECT_NOT_FOUND when it does not.
    codes.push_back(!exists.ok() ? out->code() : *exists ? v1::OK : v1::OBJECT_NOT_FOUND);
  }
  metrics_.RecordKeyCodes(Rpc::kBatchExist, codes);
  return call.Finish(absl::OkStatus());
}

grpc::ServerUnaryReactor* MasterGrpcService::BatchRemove(grpc::CallbackServerContext* context,
                                                         const v1::BatchRemoveRequest* request,
                                                         v1::BatchRemoveResponse* response) {
  Call call(metrics_, Rpc::kBatchRemove, context);
  absl::StatusOr<Identity> caller = auth_.Admit(*context, Rpc::kBatchRemove, {});
  if (!caller.ok()) return call.Finish(caller.status());
  if (grpc::ServerUnaryReactor* refused = RefuseUnlessLeader(call, context)) return refused;
  std::vector<std::string> keys = ToKeys(request->keys());
  if (absl::Status scoped = ScopeKeys(*caller, keys); !scoped.ok()) return call.Finish(scoped);
  Durable<absl::Status> removed = master_.BatchRemove(keys, request->force());
  for (const absl::Status& status : removed.results) SetResult(status, response->add_results());
  // A removal is acknowledged only once every segment that held a replica has dropped it
  // from its manifest (else a restarted master would serve the object again); else it is
  // WRITE_FAIL, retryable: a retry answers the same way (OK once durable), not
  // OBJECT_NOT_FOUND. The object is gone from the index either way. The metrics count each
  // key under the code it is finally answered.
  auto record = [this, response] {
    metrics_.RecordKeyCodes(Rpc::kBatchRemove, Codes(response->results()));
  };
  auto durable = [this, keys = std::move(keys), record] {
    master_.SettleRemovals(keys);
    record();
  };
  auto not_durable = [response, record] {
    for (v1::KeyResult& result : *response->mutable_results()) {
      if (result.code() == v1::OK) {
        result.set_code(v1::WRITE_FAIL);
        result.set_message(
            "removed, but not yet durable: a segment that held a replica did not record the "
            "removal in time (control path cut or segment gone), so a master restart before it "
            "does could bring the object back; the object is gone from the index (no reader "
            "gets it); retry BatchRemove: it answers OK once the segment has recorded it");
      }
    }
    record();
    return absl::OkStatus();
  };
  return FinishWhenDurable(call, std::move(removed.ticket), std::move(not_durable),
                           std::move(durable));
}

grpc::ServerUnaryReactor* MasterGrpcService::BatchDropReplicas(
    grpc::CallbackServerContext* context, const v1::BatchDropReplicasRequest* request,
    v1::BatchDropReplicasResponse* response) {
  Call call(metrics_, Rpc::kBatchDropReplicas, context);
  absl::StatusOr<Identity> caller = auth_.Admit(*context, Rpc::kBatchDropReplicas, {});
  if (!caller.ok()) return call.Finish(caller.status());
  if (grpc::ServerUnaryReactor* refused = RefuseUnlessLeader(call, context)) return refused;
  std::vector<std::string> keys = ToKeys(request->keys());
  if (absl::Status scoped = ScopeKeys(*caller, keys); !scoped.ok()) return call.Finish(scoped);
  Durable<absl::Status> dropped =
      master_.BatchDropReplicas(keys, request->segment(), request->force());
  for (const absl::Status& status : dropped.results) SetResult(status, response->add_results());
  // As BatchRemove: acknowledged once the segment has dropped the replica from its manifest;
  // each key counted under the code it is finally answered.
  auto record = [this, response] {
    metrics_.RecordKeyCodes(Rpc::kBatchDropReplicas, Codes(response->results()));
  };
  auto not_durable = [response, record] {
    for (v1::KeyResult& result : *response->mutable_results()) {
      if (result.code() == v1::OK) {
        result.set_code(v1::WRITE_FAIL);
        result.set_message(
            "dropped, but not yet durable: the segment did not record it in time, so a master "
            "restart before it does could bring the replica back; retry BatchDropReplicas");
      }
    }
    record();
    return absl::OkStatus();
  };
  return FinishWhenDurable(call, std::move(dropped.ticket), std::move(not_durable),
                           std::move(record));
}

grpc::ServerUnaryReactor* MasterGrpcService::RemoveAll(grpc::CallbackServerContext* context,
                                                       const v1::RemoveAllRequest* request,
                                                       v1::RemoveAllResponse* response) {
  Call call(metrics_, Rpc::kRemoveAll, context);
  absl::StatusOr<Identity> caller = auth_.Admit(*context, Rpc::kRemoveAll, {});
  if (!caller.ok()) return call.Finish(caller.status());
  if (grpc::ServerUnaryReactor* refused = RefuseUnlessLeader(call, context)) return refused;
  // RE2: linear time in the key, whatever the pattern; a caller's pattern cannot stall a shard.
  std::unique_ptr<RE2> key_filter;
  if (!request->key_regex().empty()) {
    key_filter = std::make_unique<RE2>(request->key_regex(), RE2::Quiet);
    if (!key_filter->ok()) {
      return call.Finish(absl::InvalidArgumentError(absl::StrCat(
          "key_regex \"", request->key_regex(), "\" is malformed: ", key_filter->error())));
    }
  }
  Durable<uint64_t> removed = master_.RemoveAll(request->force(), key_filter.get());
  response->set_removed(removed.results[0]);
  return FinishWhenDurable(call, std::move(removed.ticket), [] {
    return absl::UnavailableError(
        "removed, but not yet durable: a segment did not record the removals in time (control "
        "path cut or segment gone); a master restart before it does could bring objects back");
  });
}

grpc::ServerUnaryReactor* MasterGrpcService::DrainSegment(grpc::CallbackServerContext* context,
                                                          const v1::DrainSegmentRequest* request,
                                                          v1::DrainSegmentResponse* response) {
  Call call(metrics_, Rpc::kDrainSegment, context);
  absl::StatusOr<Identity> caller = auth_.Admit(*context, Rpc::kDrainSegment, {});
  if (!caller.ok()) return call.Finish(caller.status());
  if (grpc::ServerUnaryReactor* refused = RefuseUnlessLeader(call, context)) return refused;
  return call.Finish(master_.DrainSegment(request->name(), request->migrate()));
}

grpc::ServerUnaryReactor* MasterGrpcService::MigrateStart(grpc::CallbackServerContext* context,
                                                          const v1::MigrateStartRequest* request,
                                                          v1::MigrateStartResponse* response) {
  Call call(metrics_, Rpc::kMigrateStart, context);
  absl::StatusOr<Identity> caller = auth_.Admit(*context, Rpc::kMigrateStart, {});
  if (!caller.ok()) return call.Finish(caller.status());
  if (grpc::ServerUnaryReactor* refused = RefuseUnlessLeader(call, context)) return refused;
  absl::StatusOr<MigrateStartResult> started =
      master_.MigrateStart(request->segment(), request->max_objects(), request->max_bytes());
  if (!started.ok()) return call.Finish(started.status());
  for (const MigrationPlan& plan : started->migrations) {
    v1::Migration* out = response->add_migrations();
    out->set_key(plan.key);
    out->set_migration_id(plan.id);
    out->set_size(plan.size);
    out->set_checksum(plan.checksum);
    ToProto(plan.source, out->mutable_source());
    ToProto(plan.destination, out->mutable_destination());
  }
  response->set_in_flight(started->in_flight);
  response->set_unplaceable(started->unplaceable);
  return call.Finish(absl::OkStatus());
}

grpc::ServerUnaryReactor* MasterGrpcService::MigrateEnd(grpc::CallbackServerContext* context,
                                                        const v1::MigrateEndRequest* request,
                                                        v1::MigrateEndResponse* response) {
  Call call(metrics_, Rpc::kMigrateEnd, context);
  absl::StatusOr<Identity> caller = auth_.Admit(*context, Rpc::kMigrateEnd, {});
  if (!caller.ok()) return call.Finish(caller.status());
  if (grpc::ServerUnaryReactor* refused = RefuseUnlessLeader(call, context)) return refused;
  std::vector<MigrationRef> refs;
  refs.reserve(request->items_size());
  for (const v1::MigrateEndItem& item : request->items()) {
    refs.push_back(MigrationRef{item.key(), item.migration_id(), item.copied()});
  }
  Durable<absl::Status> ended = master_.MigrateEnd(refs);
  for (const absl::Status& status : ended.results) SetResult(status, response->add_results());
  metrics_.RecordKeyCodes(Rpc::kMigrateEnd, Codes(ended.results));
  return FinishWhenDurable(call, std::move(ended.ticket));
}

grpc::ServerUnaryReactor* MasterGrpcService::ReplicaCopyStart(
    grpc::CallbackServerContext* context, const v1::ReplicaCopyStartRequest* request,
    v1::ReplicaCopyStartResponse* response) {
  Call call(metrics_, Rpc::kReplicaCopyStart, context);
  absl::StatusOr<Identity> caller = auth_.Admit(*context, Rpc::kReplicaCopyStart, {});
  if (!caller.ok()) return call.Finish(caller.status());
  if (grpc::ServerUnaryReactor* refused = RefuseUnlessLeader(call, context)) return refused;
  std::vector<std::string> keys = {request->key()};
  if (absl::Status scoped = ScopeKeys(*caller, keys); !scoped.ok()) return call.Finish(scoped);
  std::vector<std::string> targets = ToKeys(request->targets());
  absl::StatusOr<MigrationPlan> plan = master_.ReplicaCopyStart(
      keys[0], targets, request->source(), request->move(), request->dry_run());
  response->set_code(ToErrorCode(plan.status()));
  metrics_.RecordKeyCodes(Rpc::kReplicaCopyStart, {response->code()});
  if (!plan.ok()) {
    response->set_message(std::string(plan.status().message()));
    return call.Finish(absl::OkStatus());
  }
  // As BatchPutStart: not past a lost leadership with a write placement.
  if (grpc::ServerUnaryReactor* refused = RefuseUnlessLeader(call, context)) return refused;
  v1::Migration* out = response->mutable_migration();
  out->set_key(request->key());  // as the caller named it (outside its tenant's namespace)
  out->set_migration_id(plan->id);
  out->set_size(plan->size);
  out->set_checksum(plan->checksum);
  if (!request->dry_run()) {
    ToProto(plan->source, out->mutable_source());
    ToProto(plan->destination, out->mutable_destination());
  }
  return call.Finish(absl::OkStatus());
}

grpc::ServerUnaryReactor* MasterGrpcService::ReplicaCopyEnd(grpc::CallbackServerContext* context,
                                                            const v1::MigrateEndRequest* request,
                                                            v1::MigrateEndResponse* response) {
  Call call(metrics_, Rpc::kReplicaCopyEnd, context);
  absl::StatusOr<Identity> caller = auth_.Admit(*context, Rpc::kReplicaCopyEnd, {});
  if (!caller.ok()) return call.Finish(caller.status());
  if (grpc::ServerUnaryReactor* refused = RefuseUnlessLeader(call, context)) return refused;
  std::vector<std::string> keys;
  keys.reserve(request->items_size());
  for (const v1::MigrateEndItem& item : request->items()) keys.push_back(item.key());
  if (absl::Status scoped = ScopeKeys(*caller, keys); !scoped.ok()) return call.Finish(scoped);
  std::vector<MigrationRef> refs;
  refs.reserve(request->items_size());
  for (int i = 0; i < request->items_size(); ++i) {
    const v1::MigrateEndItem& item = request->items(i);
    refs.push_back(MigrationRef{std::move(keys[i]), item.migration_id(), item.copied()});
  }
  Durable<absl::Status> ended = master_.ReplicaCopyEnd(refs);
  for (const absl::Status& status : ended.results) SetResult(status, response->add_results());
  // Acknowledged once the new replica's segment has recorded it (and a move's source has
  // forgotten its replica); else WRITE_FAIL, as a commit that is not durable.
  auto record = [this, response] {
    metrics_.RecordKeyCodes(Rpc::kReplicaCopyEnd, Codes(response->results()));
  };
  auto not_durable = [response, record] {
    for (v1::KeyResult& result : *response->mutable_results()) {
      if (result.code() == v1::OK) {
        result.set_code(v1::WRITE_FAIL);
        result.set_message(
            "the copy is a replica now, but its segment did not record it in time, so a "
            "master restart before it does could lose it");
      }
    }
    record();
    return absl::OkStatus();
  };
  return FinishWhenDurable(call, std::move(ended.ticket), std::move(not_durable),
                           std::move(record));
}

grpc::ServerUnaryReactor* MasterGrpcService::GetClusterStatus(
    grpc::CallbackServerContext* context, const v1::GetClusterStatusRequest* request,
    v1::GetClusterStatusResponse* response) {
  Call call(metrics_, Rpc::kGetClusterStatus, context);
  absl::StatusOr<Identity> caller = auth_.Admit(*context, Rpc::kGetClusterStatus, {});
  if (!caller.ok()) return call.Finish(caller.status());
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
  response->set_get_hits(metrics_.KeyResults(Rpc::kBatchGetReplicaList, v1::OK));
  response->set_get_misses(metrics_.KeyResults(Rpc::kBatchGetReplicaList, v1::OBJECT_NOT_FOUND));
  response->set_put_deduplicated(
      metrics_.KeyResults(Rpc::kBatchPutStart, v1::OBJECT_ALREADY_EXISTS));
  response->set_put_no_space(metrics_.KeyResults(Rpc::kBatchPutStart, v1::NO_AVAILABLE_HANDLE));
  if (leadership_ != nullptr) {
    response->set_role(!leadership_->ha()          ? "single"
                       : leadership_->IsLeader() ? "leader"
                                                 : "standby");
    response->set_term(leadership_->term());
    response->set_leader(leadership_->leader());
    response->set_self(leadership_->self());
    for (const std::string& member : leadership_->Members()) response->add_masters(member);
  } else {
    response->set_role("single");
  }
  for (const SegmentSummary& segment : summary.segments) {
    ToProto(segment, response->add_segments());
  }
  return call.Finish(absl::OkStatus());
}

grpc::ServerUnaryReactor* MasterGrpcService::ListSegments(
    grpc::CallbackServerContext* context, const v1::ListSegmentsRequest* request,
    v1::ListSegmentsResponse* response) {
  Call call(metrics_, Rpc::kListSegments, context);
  absl::StatusOr<Identity> caller = auth_.Admit(*context, Rpc::kListSegments, {});
  if (!caller.ok()) return call.Finish(caller.status());
  if (grpc::ServerUnaryReactor* refused = RefuseUnlessLeader(call, context)) return refused;
  // Key-read credentials (proto/key_read.h) for callers who may read objects, of their own
  // tenant: what they could read through the master anyway.
  bool reader = RuleFor(Rpc::kBatchGetReplicaList, caller->role) != Rule::kDeny;
  for (const SegmentSummary& segment : master_.ListSegments(
           reader ? std::optional<absl::string_view>(caller->tenant) : std::nullopt)) {
    ToProto(segment, response->add_segments());
  }
  response->set_tenant(caller->tenant);
  return call.Finish(absl::OkStatus());
}

}  // namespace kvpool::master
