#include "client/master_client.h"

#include <algorithm>
#include <cstring>
#include <string_view>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "google/protobuf/arena.h"
#include "kvpool/v1/master.grpc.pb.h"
#include "proto/channel.h"
#include "proto/error_codes.h"

namespace kvpool::client {
namespace {

absl::Status CountMismatch(size_t got, size_t expected) {
  return absl::InternalError(
      absl::StrCat("master answered ", got, " results for ", expected, " keys"));
}

v1::PinMode ToWire(PinMode pin) {
  switch (pin) {
    case PinMode::kHard:
      return v1::PIN_HARD;
    case PinMode::kSoft:
      return v1::PIN_SOFT;
    case PinMode::kNone:
      break;
  }
  return v1::PIN_NONE;
}

// Sets `out`'s token from the one the master sent, after the checks of every placement:
// InternalError for one the master got wrong: a token of the wrong size (none is right where
// none was asked for: `token` false; a master from before without_tokens sends one anyway), or
// a length (out->length) other than the object's `size`.
absl::Status SetToken(std::string_view wire_token, uint64_t size, bool token, Placement* out) {
  const bool none = !token && wire_token.empty();
  if (!none && wire_token.size() != out->token.size()) {
    return absl::InternalError(absl::StrCat("master sent a ", wire_token.size(), "-byte token"));
  }
  if (!none) std::memcpy(out->token.data(), wire_token.data(), out->token.size());
  if (out->length != size) {
    return absl::InternalError(
        absl::StrCat("master placed ", out->length, " bytes for an object of ", size));
  }
  return absl::OkStatus();
}

// A placement as the client uses it; InternalError as SetToken says.
absl::StatusOr<Placement> FromWire(const v1::Placement& placement, uint64_t size,
                                   bool token = true) {
  Placement out{.segment_name = placement.segment_name(),
                .endpoint = placement.endpoint(),
                .host = placement.host(),
                .incarnation = placement.incarnation(),
                .offset = placement.offset(),
                .length = placement.length()};
  if (absl::Status set = SetToken(placement.token(), size, token, &out); !set.ok()) return set;
  return out;
}

// The per-key statuses of an answer of KeyResults for `n` keys.
template <typename Response>
absl::StatusOr<std::vector<absl::Status>> Statuses(const absl::StatusOr<Response>& response,
                                                   size_t n) {
  if (!response.ok()) return response.status();
  if (response->results_size() != static_cast<int>(n)) {
    return CountMismatch(response->results_size(), n);
  }
  std::vector<absl::Status> results;
  results.reserve(n);
  for (const v1::KeyResult& result : response->results()) {
    results.push_back(FromErrorCode(result.code(), result.message()));
  }
  return results;
}

// As Statuses, with the call's failure for every key.
template <typename Response>
std::vector<absl::Status> KeyStatuses(const absl::StatusOr<Response>& response, size_t n) {
  absl::StatusOr<std::vector<absl::Status>> results = Statuses(response, n);
  if (!results.ok()) return std::vector<absl::Status>(n, results.status());
  return *std::move(results);
}

absl::StatusOr<Migration> FromWire(const v1::Migration& migration) {
  absl::StatusOr<Placement> source = FromWire(migration.source(), migration.size());
  if (!source.ok()) return source.status();
  absl::StatusOr<Placement> destination = FromWire(migration.destination(), migration.size());
  if (!destination.ok()) return destination.status();
  return Migration{.key = migration.key(),
                   .migration_id = migration.migration_id(),
                   .size = migration.size(),
                   .checksum = migration.checksum(),
                   .source = *std::move(source),
                   .destination = *std::move(destination)};
}

v1::MigrateEndRequest ToWire(absl::Span<const MigrationEnd> items) {
  v1::MigrateEndRequest request;
  for (const MigrationEnd& end : items) {
    v1::MigrateEndItem* item = request.add_items();
    item->set_key(end.key);
    item->set_migration_id(end.migration_id);
    item->set_copied(end.copied);
  }
  return request;
}

class GrpcMasterClient final : public MasterClient {
 public:
  GrpcMasterClient(std::unique_ptr<MasterLocator> locator, absl::Duration rpc_timeout,
                   ClientTlsOptions tls, std::string auth_token)
      : locator_(std::move(locator)),
        address_(locator_->spec()),
        rpc_timeout_(rpc_timeout),
        tls_(std::move(tls)),
        auth_token_(std::move(auth_token)),
        stub_(locator_->single() ? v1::MasterService::NewStub(MakeMasterChannel(address_, tls_))
                                 : nullptr) {}

  absl::Status WaitForMaster(absl::Duration timeout) override;
  absl::StatusOr<std::vector<Reservation>> BatchPutStart(const PutStartRequest& request) override;
  absl::StatusOr<std::vector<absl::Status>> BatchPutEnd(absl::Span<const PutEnd> items) override;
  absl::Status BatchPutRevoke(absl::Span<const PutEnd> items) override;
  absl::StatusOr<std::vector<Location>> BatchGetReplicaList(
      absl::Span<const std::string> keys, const LocateOptions& options) override;
  absl::StatusOr<std::vector<absl::StatusOr<bool>>> BatchExist(
      absl::Span<const std::string> keys) override;
  std::vector<absl::Status> BatchRemove(absl::Span<const std::string> keys, bool force) override;
  std::vector<absl::Status> BatchDropReplicas(absl::Span<const std::string> keys,
                                              absl::string_view segment, bool force) override;
  absl::StatusOr<uint64_t> RemoveAll(bool force, absl::string_view key_regex) override;
  absl::StatusOr<ClusterStatus> GetClusterStatus() override;
  absl::StatusOr<SegmentList> ListSegments() override;
  absl::Status DrainSegment(absl::string_view name, bool migrate) override;
  absl::StatusOr<MigrationBatch> MigrateStart(absl::string_view segment, uint32_t max_objects,
                                              uint64_t max_bytes) override;
  absl::StatusOr<std::vector<absl::Status>> MigrateEnd(
      absl::Span<const MigrationEnd> items) override;
  absl::StatusOr<CopyStart> ReplicaCopyStart(absl::string_view key,
                                             absl::Span<const std::string> targets,
                                             absl::string_view move_from, bool dry_run) override;
  absl::StatusOr<std::vector<absl::Status>> ReplicaCopyEnd(
      absl::Span<const MigrationEnd> items) override;

 private:
  template <typename Request, typename Response>
  using Method = grpc::Status (v1::MasterService::Stub::*)(grpc::ClientContext*, const Request&,
                                                           Response*);

  // The answer into `*response` (which may live on an arena, as the caller's).
  template <typename Request, typename Response>
  absl::Status CallInto(Method<Request, Response> method, const Request& request,
                        absl::Duration timeout, Response* response, bool wait_for_ready = false);
  template <typename Request, typename Response>
  absl::StatusOr<Response> Call(Method<Request, Response> method, const Request& request,
                                absl::Duration timeout, bool wait_for_ready = false) {
    Response response;
    absl::Status status = CallInto(method, request, timeout, &response, wait_for_ready);
    if (!status.ok()) return status;
    return response;
  }
  template <typename Request, typename Response>
  absl::StatusOr<Response> Call(Method<Request, Response> method, const Request& request) {
    return Call(method, request, rpc_timeout_);
  }
  // CallInto() among several masters.
  template <typename Request, typename Response>
  absl::Status CallLeader(Method<Request, Response> method, const Request& request,
                          absl::Duration timeout, Response* response);
  // The leader's status where a standby answered and named it.
  absl::StatusOr<v1::GetClusterStatusResponse> LeaderStatus();

  std::shared_ptr<v1::MasterService::Stub> Stub() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return stub_;
  }
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

void GrpcMasterClient::Reconnect() {
  absl::MutexLock lock(&mu_);
  if (absl::Now() - reconnected_ < absl::Seconds(1)) return;
  reconnected_ = absl::Now();
  stub_ = v1::MasterService::NewStub(MakeMasterChannel(address_, tls_));
}

template <typename Request, typename Response>
absl::Status GrpcMasterClient::CallInto(Method<Request, Response> method, const Request& request,
                                        absl::Duration timeout, Response* response,
                                        bool wait_for_ready) {
  if (!locator_->single()) return CallLeader(method, request, timeout, response);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  context.set_wait_for_ready(wait_for_ready);
  AttachToken(context, auth_token_);
  grpc::Status status = (Stub().get()->*method)(&context, request, response);
  if (status.error_code() == grpc::StatusCode::UNAVAILABLE) Reconnect();
  if (!status.ok()) return FromGrpcStatus(status);
  return absl::OkStatus();
}

template <typename Request, typename Response>
absl::Status GrpcMasterClient::CallLeader(Method<Request, Response> method, const Request& request,
                                          absl::Duration timeout, Response* response) {
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
    response->Clear();
    std::unique_ptr<v1::MasterService::Stub> stub =
        v1::MasterService::NewStub(locator_->Channel(address));
    last = (stub.get()->*method)(&context, request, response);
    if (last.ok()) return absl::OkStatus();
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

absl::Status GrpcMasterClient::WaitForMaster(absl::Duration timeout) {
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
      v1::GetClusterStatusResponse answer;
      absl::Status called =
          CallLeader(&v1::MasterService::Stub::GetClusterStatus, v1::GetClusterStatusRequest(),
                     std::min(rpc_timeout_, deadline - absl::Now()), &answer);
      if (called.ok()) {
        status = std::move(answer);
      } else {
        status = called;
      }
      if (absl::IsUnauthenticated(status.status()) ||
          absl::IsPermissionDenied(status.status())) {
        return status.status();
      }
    }
    if (status.ok()) return absl::OkStatus();
  }
  return WithErrorCode(
      absl::UnavailableError(absl::StrCat("no kvpool-master answered at ", address_, " within ",
                                          absl::FormatDuration(timeout), ": ",
                                          status.status().message())),
      v1::RPC_FAIL);
}

absl::StatusOr<std::vector<Reservation>> GrpcMasterClient::BatchPutStart(
    const PutStartRequest& request) {
  const size_t n = request.keys.size();
  if (request.sizes.size() != n) {
    return absl::InvalidArgumentError("keys and sizes differ in number");
  }
  v1::BatchPutStartRequest start;
  start.set_replica_num(request.replicas);
  start.set_pin(ToWire(request.pin));
  start.set_preferred_host(request.preferred_host);
  start.set_preferred_machine_id(request.preferred_machine_id);
  for (const std::string& segment : request.preferred_segments) {
    start.add_preferred_segments(segment);
  }
  for (size_t i = 0; i < n; ++i) {
    start.add_keys(request.keys[i]);
    start.add_sizes(request.sizes[i]);
  }
  absl::StatusOr<v1::BatchPutStartResponse> reserved =
      Call(&v1::MasterService::Stub::BatchPutStart, start);
  if (!reserved.ok()) return reserved.status();
  if (reserved->results_size() != static_cast<int>(n)) {
    return CountMismatch(reserved->results_size(), n);
  }
  std::vector<Reservation> results(n);
  for (size_t i = 0; i < n; ++i) {
    const v1::PutStartResult& result = reserved->results(static_cast<int>(i));
    Reservation& out = results[i];
    out.status = FromErrorCode(result.code(), result.message());
    if (!out.status.ok()) continue;
    out.put_id = result.put_id();
    if (result.placements().empty()) {
      out.status = absl::InternalError("master gave no placement");
      continue;
    }
    if (result.deadline_unix_ms() != 0) {
      out.deadline = absl::FromUnixMillis(result.deadline_unix_ms());
    }
    for (const v1::Placement& placement : result.placements()) {
      absl::StatusOr<Placement> converted = FromWire(placement, request.sizes[i]);
      if (!converted.ok()) {
        out.status = converted.status();
        break;
      }
      out.placements.push_back(*std::move(converted));
    }
    if (!out.status.ok()) out.placements.clear();
  }
  return results;
}

absl::StatusOr<std::vector<absl::Status>> GrpcMasterClient::BatchPutEnd(
    absl::Span<const PutEnd> items) {
  v1::BatchPutEndRequest end;
  for (const PutEnd& commit : items) {
    v1::PutEndItem* item = end.add_items();
    item->set_key(commit.key);
    item->set_put_id(commit.put_id);
    item->set_checksum(commit.checksum);
  }
  return Statuses(Call(&v1::MasterService::Stub::BatchPutEnd, end), items.size());
}

absl::Status GrpcMasterClient::BatchPutRevoke(absl::Span<const PutEnd> items) {
  v1::BatchPutRevokeRequest revoke;
  for (const PutEnd& reservation : items) {
    v1::PutEndItem* item = revoke.add_items();
    item->set_key(reservation.key);
    item->set_put_id(reservation.put_id);
  }
  return Call(&v1::MasterService::Stub::BatchPutRevoke, revoke).status();
}

absl::StatusOr<std::vector<Location>> GrpcMasterClient::BatchGetReplicaList(
    absl::Span<const std::string> keys, const LocateOptions& options) {
  // The request and the answer live on an arena: a string per key, a message per key and per
  // replica, all freed at once.
  google::protobuf::Arena arena;
  auto* request = google::protobuf::Arena::CreateMessage<v1::BatchGetReplicaListRequest>(&arena);
  request->mutable_keys()->Reserve(static_cast<int>(keys.size()));
  for (const std::string& key : keys) request->add_keys(key);
  request->set_without_tokens(!options.tokens);
  // Each segment named once per answer; a master from before answers full placements, which
  // are read as well.
  request->set_compact_placements(true);
  auto* answer = google::protobuf::Arena::CreateMessage<v1::BatchGetReplicaListResponse>(&arena);
  absl::Time asked = absl::Now();
  if (absl::Status called =
          CallInto(&v1::MasterService::Stub::BatchGetReplicaList, *request,
                   std::min(rpc_timeout_, options.timeout.value_or(rpc_timeout_)), answer);
      !called.ok()) {
    return called;
  }
  if (answer->results_size() != static_cast<int>(keys.size())) {
    return CountMismatch(answer->results_size(), keys.size());
  }
  // The compact answer's segment table, converted once: each replica starts as a copy of its
  // segment's entry.
  std::vector<Placement> segments;
  segments.reserve(answer->segments_size());
  for (const v1::SegmentRef& segment : answer->segments()) {
    segments.push_back(Placement{.segment_name = segment.name(),
                                 .endpoint = segment.endpoint(),
                                 .host = segment.host(),
                                 .incarnation = segment.incarnation()});
  }
  std::vector<Location> located(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    const v1::GetResult& result = answer->results(static_cast<int>(i));
    Location& out = located[i];
    out.status = FromErrorCode(result.code(), result.message());
    if (!out.status.ok()) continue;
    if (result.replicas().empty() && result.compact_replicas().empty()) {
      out.status = absl::InternalError("master gave no replica");
      continue;
    }
    out.size = result.size();
    out.checksum = result.checksum();
    out.lease = absl::Milliseconds(result.lease_ttl_ms());
    out.lease_expiry = asked + out.lease;
    out.replicas.reserve(result.replicas_size() + result.compact_replicas_size());
    for (const v1::Placement& replica : result.replicas()) {
      absl::StatusOr<Placement> converted = FromWire(replica, result.size(), options.tokens);
      if (!converted.ok()) {
        out.status = converted.status();
        break;
      }
      out.replicas.push_back(*std::move(converted));
    }
    for (const v1::CompactPlacement& replica : result.compact_replicas()) {
      if (!out.status.ok()) break;
      if (replica.segment() >= segments.size()) {
        out.status = absl::InternalError(absl::StrCat("master named segment ", replica.segment(),
                                                      " of a table of ", segments.size()));
        break;
      }
      Placement& placement = out.replicas.emplace_back(segments[replica.segment()]);
      placement.offset = replica.offset();
      placement.length = replica.length();
      out.status = SetToken(replica.token(), result.size(), options.tokens, &placement);
    }
    if (!out.status.ok()) out.replicas.clear();
  }
  return located;
}

absl::StatusOr<std::vector<absl::StatusOr<bool>>> GrpcMasterClient::BatchExist(
    absl::Span<const std::string> keys) {
  v1::BatchExistRequest request;
  for (const std::string& key : keys) request.add_keys(key);
  absl::StatusOr<v1::BatchExistResponse> response =
      Call(&v1::MasterService::Stub::BatchExist, request);
  if (!response.ok()) return response.status();
  if (response->results_size() != static_cast<int>(keys.size())) {
    return CountMismatch(response->results_size(), keys.size());
  }
  std::vector<absl::StatusOr<bool>> results;
  results.reserve(keys.size());
  for (const v1::ExistResult& result : response->results()) {
    if (result.code() == v1::OK) {
      results.push_back(result.exists());
    } else {
      results.push_back(FromErrorCode(result.code(), ""));
    }
  }
  return results;
}

std::vector<absl::Status> GrpcMasterClient::BatchRemove(absl::Span<const std::string> keys,
                                                        bool force) {
  v1::BatchRemoveRequest request;
  request.set_force(force);
  for (const std::string& key : keys) request.add_keys(key);
  return KeyStatuses(Call(&v1::MasterService::Stub::BatchRemove, request), keys.size());
}

std::vector<absl::Status> GrpcMasterClient::BatchDropReplicas(absl::Span<const std::string> keys,
                                                              absl::string_view segment,
                                                              bool force) {
  v1::BatchDropReplicasRequest request;
  request.set_segment(std::string(segment));
  request.set_force(force);
  for (const std::string& key : keys) request.add_keys(key);
  return KeyStatuses(Call(&v1::MasterService::Stub::BatchDropReplicas, request), keys.size());
}

absl::StatusOr<uint64_t> GrpcMasterClient::RemoveAll(bool force, absl::string_view key_regex) {
  v1::RemoveAllRequest request;
  request.set_force(force);
  request.set_key_regex(std::string(key_regex));
  absl::StatusOr<v1::RemoveAllResponse> response =
      Call(&v1::MasterService::Stub::RemoveAll, request);
  if (!response.ok()) return response.status();
  return response->removed();
}

absl::StatusOr<v1::GetClusterStatusResponse> GrpcMasterClient::LeaderStatus() {
  absl::StatusOr<v1::GetClusterStatusResponse> status =
      Call(&v1::MasterService::Stub::GetClusterStatus, v1::GetClusterStatusRequest());
  // A standby answers status too; the leader's answer is the one wanted, when it gives one.
  if (status.ok() && !locator_->single() && status->role() == "standby" &&
      !status->leader().empty() && status->leader() != status->self()) {
    locator_->Failed(status->self(), status->leader());
    absl::StatusOr<v1::GetClusterStatusResponse> leader =
        Call(&v1::MasterService::Stub::GetClusterStatus, v1::GetClusterStatusRequest());
    if (leader.ok() && leader->role() == "leader") return leader;
  }
  return status;
}

absl::StatusOr<ClusterStatus> GrpcMasterClient::GetClusterStatus() {
  absl::StatusOr<v1::GetClusterStatusResponse> response = LeaderStatus();
  if (!response.ok()) return response.status();
  ClusterStatus status;
  status.capacity_bytes = response->capacity_bytes();
  status.used_bytes = response->used_bytes();
  status.objects = response->objects();
  status.pending_objects = response->pending_objects();
  status.leased_objects = response->leased_objects();
  status.soft_pinned_objects = response->soft_pinned_objects();
  status.hard_pinned_objects = response->hard_pinned_objects();
  status.evicted_objects = response->evicted_objects();
  status.evicted_bytes = response->evicted_bytes();
  status.reclaimed_reservations = response->reclaimed_reservations();
  status.get_hits = response->get_hits();
  status.get_misses = response->get_misses();
  status.put_deduplicated = response->put_deduplicated();
  status.put_no_space = response->put_no_space();
  status.role = response->role().empty() ? "single" : response->role();
  status.term = response->term();
  status.leader = response->leader();
  status.masters.assign(response->masters().begin(), response->masters().end());
  status.answered_by = response->self();
  for (const v1::SegmentStatus& s : response->segments()) {
    status.segments.push_back(SegmentStatus{
        .name = s.name(),
        .host = s.host(),
        .endpoint = s.endpoint(),
        .capacity_bytes = s.capacity_bytes(),
        .used_bytes = s.used_bytes(),
        .replicas = s.replicas(),
        .state = s.state(),
        .last_heartbeat_age = absl::Milliseconds(s.last_heartbeat_age_ms()),
    });
  }
  return status;
}

absl::StatusOr<SegmentList> GrpcMasterClient::ListSegments() {
  absl::StatusOr<v1::ListSegmentsResponse> response =
      Call(&v1::MasterService::Stub::ListSegments, v1::ListSegmentsRequest());
  if (!response.ok()) return response.status();
  SegmentList list{.tenant = response->tenant()};
  for (const v1::SegmentStatus& s : response->segments()) {
    SegmentEntry& entry = list.segments.emplace_back(SegmentEntry{.name = s.name(),
                                                                  .endpoint = s.endpoint(),
                                                                  .host = s.host(),
                                                                  .shm_socket = s.shm_socket(),
                                                                  .machine_id = s.machine_id()});
    entry.active = absl::StartsWith(s.state(), "active");
    entry.capacity = s.capacity_bytes();
    if (s.key_read_credential().size() == wire::kTokenSize) {
      entry.key_read_credential.emplace();
      std::memcpy(entry.key_read_credential->data(), s.key_read_credential().data(),
                  wire::kTokenSize);
      entry.key_read_expiry = absl::FromUnixMillis(static_cast<int64_t>(s.key_read_expiry_ms()));
    }
  }
  return list;
}

absl::Status GrpcMasterClient::DrainSegment(absl::string_view name, bool migrate) {
  v1::DrainSegmentRequest request;
  request.set_name(std::string(name));
  request.set_migrate(migrate);
  return Call(&v1::MasterService::Stub::DrainSegment, request).status();
}

absl::StatusOr<MigrationBatch> GrpcMasterClient::MigrateStart(absl::string_view segment,
                                                              uint32_t max_objects,
                                                              uint64_t max_bytes) {
  v1::MigrateStartRequest ask;
  ask.set_segment(std::string(segment));
  ask.set_max_objects(max_objects);
  ask.set_max_bytes(max_bytes);
  absl::StatusOr<v1::MigrateStartResponse> batch =
      Call(&v1::MasterService::Stub::MigrateStart, ask);
  if (!batch.ok()) return batch.status();
  MigrationBatch out{.unplaceable = batch->unplaceable(), .in_flight = batch->in_flight()};
  for (const v1::Migration& migration : batch->migrations()) {
    absl::StatusOr<Migration> converted = FromWire(migration);
    if (!converted.ok()) return converted.status();
    out.migrations.push_back(*std::move(converted));
  }
  return out;
}

absl::StatusOr<std::vector<absl::Status>> GrpcMasterClient::MigrateEnd(
    absl::Span<const MigrationEnd> items) {
  return Statuses(Call(&v1::MasterService::Stub::MigrateEnd, ToWire(items)), items.size());
}

absl::StatusOr<CopyStart> GrpcMasterClient::ReplicaCopyStart(
    absl::string_view key, absl::Span<const std::string> targets, absl::string_view move_from,
    bool dry_run) {
  v1::ReplicaCopyStartRequest request;
  request.set_key(std::string(key));
  for (const std::string& target : targets) request.add_targets(target);
  request.set_source(std::string(move_from));
  request.set_move(!move_from.empty());
  request.set_dry_run(dry_run);
  absl::StatusOr<v1::ReplicaCopyStartResponse> answer =
      Call(&v1::MasterService::Stub::ReplicaCopyStart, request);
  if (!answer.ok()) return answer.status();
  CopyStart out{.status = FromErrorCode(answer->code(), answer->message())};
  if (out.status.ok() && !dry_run) {
    absl::StatusOr<Migration> migration = FromWire(answer->migration());
    if (!migration.ok()) return migration.status();
    out.migration = *std::move(migration);
  }
  return out;
}

absl::StatusOr<std::vector<absl::Status>> GrpcMasterClient::ReplicaCopyEnd(
    absl::Span<const MigrationEnd> items) {
  return Statuses(Call(&v1::MasterService::Stub::ReplicaCopyEnd, ToWire(items)), items.size());
}

}  // namespace

std::unique_ptr<MasterClient> MakeGrpcMasterClient(std::unique_ptr<MasterLocator> locator,
                                                   absl::Duration rpc_timeout,
                                                   ClientTlsOptions tls,
                                                   std::string auth_token) {
  return std::make_unique<GrpcMasterClient>(std::move(locator), rpc_timeout, std::move(tls),
                                            std::move(auth_token));
}

}  // namespace kvpool::client
