#include "server/segment/master_link.h"

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/log_limiter.h"
#include "common/net.h"
#include "grpcpp/grpcpp.h"
#include "kvpool/v1/master.grpc.pb.h"
#include "proto/capability.h"
#include "proto/channel.h"
#include "proto/master_locator.h"

namespace kvpool::segment {
namespace {

// Manifest records per RestoreManifest call.
constexpr size_t kRestoreChunk = 4096;
// Deadline of a heartbeat sent after a failed one (answered at once, see Heartbeat).
constexpr absl::Duration kProbeTimeout = absl::Seconds(1);

void AddBusyRanges(const std::vector<wire::ByteRange>& busy,
                   google::protobuf::RepeatedPtrField<v1::ByteRange>* out) {
  for (const wire::ByteRange& range : busy) {
    v1::ByteRange* added = out->Add();
    added->set_offset(range.offset);
    added->set_length(range.length);
  }
}

}  // namespace

MasterLink::MasterLink(MasterLinkOptions options, Manifest& manifest, GrantTable& grants)
    : options_(std::move(options)), manifest_(manifest), grants_(grants) {
  // Segment::Start checked the address already.
  absl::StatusOr<std::unique_ptr<MasterLocator>> locator =
      MasterLocator::Create(options_.master_address, kDefaultEtcdPrefix, options_.tls);
  KVPOOL_CHECK(locator.ok()) << locator.status();
  locator_ = std::move(*locator);
}

std::string MasterLink::master() const {
  absl::MutexLock lock(&mu_);
  return mounted_.load() ? master_ : "";
}

absl::Status MasterLink::CheckTerm(const std::string& master, int64_t term) {
  int64_t followed = term_.load();
  if (term < followed) {
    return absl::FailedPreconditionError(
        absl::StrCat("master ", master, " answers for term ", term,
                     ", older than term ", followed, " this segment already followed: refused"));
  }
  term_.store(term);
  return absl::OkStatus();
}

void MasterLink::MoveOn(const std::string& leader_hint) {
  std::string left;
  {
    absl::MutexLock lock(&mu_);
    left = master_;
  }
  mounted_.store(false);
  heartbeat_failures_ = 0;
  locator_->Failed(left, leader_hint);
}

MasterLink::~MasterLink() { Stop(); }

void MasterLink::Start() { thread_ = std::thread([this] { Loop(); }); }

void MasterLink::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    // Else stopping waits out the master's hold of the poll (a heartbeat interval).
    if (heartbeat_call_ != nullptr) heartbeat_call_->TryCancel();
  }
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
  if (mounted_.exchange(false)) Unmount();
}

void MasterLink::Loop() {
  bool failing = false;
  while (true) {
    absl::Status status = mounted_.load() ? Heartbeat() : Mount();
    if (!status.ok() && !failing) {
      // Logged once per outage, not once per retry.
      KVPOOL_LOG(WARNING) << status.message() << "; retrying";
    } else if (status.ok() && failing) {
      KVPOOL_LOG(INFO) << "master " << master() << " answers again";
    }
    failing = !status.ok();
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    // A heartbeat paces itself (the master holds it), so a good one is followed by the next at
    // once: no Await with a zero timeout, which still blocks on a futex whose deadline has
    // passed, a system call (and a chance to lose the core) between a heartbeat's answer and
    // the next heartbeat, which acknowledges the commits it carried.
    if (!failing) continue;
    // Failures wait before retrying; among several masters, a new leader is found sooner.
    const absl::Duration retry = locator_->single()
                                     ? options_.retry_interval
                                     : std::min(options_.retry_interval, absl::Milliseconds(200));
    if (mu_.AwaitWithTimeout(absl::Condition(&stopping_), retry)) return;
  }
}

absl::Status MasterLink::Mount() {
  std::string master = locator_->Current();
  {
    absl::MutexLock lock(&mu_);
    master_ = master;
  }
  std::unique_ptr<v1::MasterService::Stub> stub =
      v1::MasterService::NewStub(locator_->Channel(master));
  std::vector<v1::ManifestRecord> entries = manifest_.Entries();
  v1::MountSegmentRequest request;
  request.set_name(options_.name);
  request.set_host(options_.host);
  request.set_endpoint(options_.endpoint);
  request.set_size(options_.size);
  request.set_incarnation(options_.incarnation);
  // The secret of the term this mount starts. It takes effect (NewTerm, below) only once the
  // master has accepted the mount and the manifest: until then the previous master's tokens
  // keep verifying, so reads of cached locations go on while no master answers (a fail-over,
  // or this segment cut from the masters).
  std::string secret = wire::NewCapabilitySecret();
  request.set_token_secret(secret);
  request.set_manifest_objects(entries.size());
  request.set_shm_socket(options_.shm_socket);
  request.set_machine_id(MachineId());
  // None of the shared-memory writes in flight is of this master's grants (a new term ends
  // them all once the manifest is reported): it places nothing in their ranges until a
  // heartbeat no longer lists them.
  AddBusyRanges(grants_.BusyRanges(/*every_shm_write=*/true), request.mutable_busy_ranges());
  v1::MountSegmentResponse response;
  grpc::ClientContext context;
  AttachToken(context, options_.auth_token);
  context.set_deadline(absl::ToChronoTime(absl::Now() + options_.rpc_timeout));
  grpc::Status status = stub->MountSegment(&context, request, &response);
  if (!status.ok()) {
    if (!locator_->single()) locator_->Failed(master, LeaderHint(context));
    return absl::UnavailableError(
        absl::StrCat("mount on master ", master, " failed: ", status.error_message()));
  }
  if (absl::Status current = CheckTerm(master, response.term()); !current.ok()) {
    locator_->Failed(master, "");
    return current;
  }
  // Reads of this master's term verify from here on (it serves them as soon as the manifest
  // below has told it what this segment holds), besides the previous term's.
  grants_.PrepareTerm(secret);
  if (response.heartbeat_interval_ms() > 0) {
    heartbeat_interval_ = absl::Milliseconds(response.heartbeat_interval_ms());
  }
  if (response.heartbeat_ttl_ms() > 0) {
    segment_ttl_ = absl::Milliseconds(response.heartbeat_ttl_ms());
  }
  // Report what this segment holds, so a restarted master serves it again.
  for (size_t first = 0; first < entries.size(); first += kRestoreChunk) {
    v1::RestoreManifestRequest restore;
    restore.set_name(options_.name);
    restore.set_incarnation(options_.incarnation);
    size_t last = std::min(entries.size(), first + kRestoreChunk);
    for (size_t i = first; i < last; ++i) *restore.add_records() = entries[i];
    restore.set_done(last == entries.size());
    v1::RestoreManifestResponse restored;
    grpc::ClientContext restore_context;
    AttachToken(restore_context, options_.auth_token);
    restore_context.set_deadline(absl::ToChronoTime(absl::Now() + options_.rpc_timeout));
    grpc::Status sent = stub->RestoreManifest(&restore_context, restore, &restored);
    if (!sent.ok()) {
      if (!locator_->single()) locator_->Failed(master, LeaderHint(restore_context));
      return absl::UnavailableError(
          absl::StrCat("reporting the manifest failed: ", sent.error_message()));
    }
    std::vector<std::string> refused(restored.refused_keys().begin(), restored.refused_keys().end());
    if (!refused.empty()) {
      KVPOOL_LOG(WARNING) << "master refused " << refused.size() << " manifest entries";
      manifest_.Forget(refused);
    }
  }
  // A new term: from here on only this master's tokens verify, and no write of the old term
  // lands another byte (that master's reservations are gone with it). Only now, with the
  // manifest reported: a cached location of the old term still reads until the new master
  // can answer for its object. This master takes no new object on this segment before the
  // manifest's last chunk, and a write token it minted before this line is refused (only its
  // reads verify yet), so no write of its term ever mixes with one of the old.
  grants_.NewTerm(secret);
  acked_seq_ = 0;
  refused_seqs_.clear();  // sequence numbers of the previous master
  mounted_.store(true);
  mount_count_.fetch_add(1);
  KVPOOL_LOG(INFO) << "mounted on master " << master << " as " << options_.name
                   << (response.term() > 0 ? absl::StrCat(" (term ", response.term(), ")") : "")
                   << (entries.empty() ? "" : absl::StrCat(", reported ", entries.size(), " objects"));
  if (options_.print_mounts) {
    std::printf("kvpool-segment mounted master=%s objects=%zu term=%lld\n", master.c_str(),
                entries.size(), static_cast<long long>(response.term()));
    std::fflush(stdout);
  }
  return absl::OkStatus();
}

absl::Status MasterLink::Heartbeat() {
  std::string master;
  {
    absl::MutexLock lock(&mu_);
    master = master_;
  }
  std::unique_ptr<v1::MasterService::Stub> stub =
      v1::MasterService::NewStub(locator_->Channel(master));
  v1::HeartbeatRequest request;
  request.set_name(options_.name);
  request.set_incarnation(options_.incarnation);
  request.set_acked_seq(acked_seq_);
  for (uint64_t seq : refused_seqs_) request.add_refused_seqs(seq);
  // With the acknowledgement of the FORGET that left a range busy, so the master holds the
  // range before it would free it.
  AddBusyRanges(grants_.BusyRanges(), request.mutable_busy_ranges());
  for (std::string& key : manifest_.TakeReads()) request.add_keys_read(std::move(key));
  // After a failed heartbeat the next ones are probes: answered at once (no long poll) within
  // a short deadline, so a healed control path is found within about a second, not after a
  // held poll into a dead connection runs out its whole deadline. (Among several masters a
  // failure moves on to another master instead, see below.)
  const bool probe = last_heartbeat_failed_ && locator_->single();
  const absl::Duration hold = probe ? absl::ZeroDuration() : heartbeat_interval_;
  request.set_wait_ms(static_cast<uint32_t>(absl::ToInt64Milliseconds(hold)));
  v1::HeartbeatResponse response;
  grpc::ClientContext context;
  AttachToken(context, options_.auth_token);
  // The master answers within about a heartbeat interval. Among several masters a leader
  // that does not (stopped, cut off) is left sooner, for the one that replaced it.
  absl::Duration grace = locator_->single()
                             ? options_.rpc_timeout
                             : std::min(options_.rpc_timeout, absl::Milliseconds(1500));
  if (probe) grace = std::min(grace, kProbeTimeout);
  const absl::Time sent = absl::Now();
  context.set_deadline(absl::ToChronoTime(sent + hold + grace));
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return absl::OkStatus();
    heartbeat_call_ = &context;
  }
  grpc::Status status = stub->Heartbeat(&context, request, &response);
  {
    absl::MutexLock lock(&mu_);
    heartbeat_call_ = nullptr;
    if (stopping_) return absl::OkStatus();
  }
  if (!status.ok()) {
    if (!locator_->single()) {
      if (AnsweredByStandby(context)) {
        // Deposed or never the leader: mount on the leader now.
        KVPOOL_LOG(WARNING) << "master " << master << " is no longer the leader ("
                            << status.error_message() << "); mounting on the leader";
        MoveOn(LeaderHint(context));
        return Mount();
      }
      // Refused at once twice (its process gone), or not answered in time once.
      if (++heartbeat_failures_ >= 2 ||
          status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
        KVPOOL_LOG(WARNING) << "master " << master << " does not answer ("
                            << status.error_message() << "); mounting on another master";
        MoveOn("");
        return Mount();
      }
    } else {
      // The one master: a fresh channel for the next probe. The failed one would sit out
      // gRPC's reconnect backoff on a connection that a healed path no longer carries.
      locator_->Failed(master, "");
    }
    last_heartbeat_failed_ = true;
    return absl::UnavailableError(absl::StrCat("heartbeat to master ", master,
                                               " failed: ", status.error_message()));
  }
  heartbeat_failures_ = 0;
  last_heartbeat_failed_ = false;
  if (absl::Status current = CheckTerm(master, response.term()); !current.ok()) {
    KVPOOL_LOG(WARNING) << current.message();
    MoveOn("");
    return current;
  }
  if (response.drained()) {
    KVPOOL_LOG(INFO) << "the master drained this segment; stopping";
    mounted_.store(false);
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
    }
    if (options_.on_drained) options_.on_drained();
    return absl::OkStatus();
  }
  if (!response.known()) {
    KVPOOL_LOG(WARNING) << "master " << master << " does not know this segment; mounting again";
    mounted_.store(false);
    in_touch_until_ns_.store(0, std::memory_order_relaxed);
    return Mount();
  }
  // The master saw this heartbeat after it was sent: it declares the segment dead no sooner
  // than a TTL after that.
  in_touch_until_ns_.store(absl::ToUnixNanos(sent + segment_ttl_ / 2), std::memory_order_relaxed);
  // The master has them now (this answer acknowledges the request that carried them).
  refused_seqs_.clear();
  if (response.records_size() > 0) {
    // Grants end before the records are acknowledged (with the next heartbeat): the master
    // reuses a range only then.
    std::vector<v1::ManifestRecord> applied;
    applied.reserve(response.records_size());
    uint64_t seq = response.last_seq() - static_cast<uint64_t>(response.records_size());
    for (const v1::ManifestRecord& record : response.records()) {
      ++seq;
      bool add = record.kind() == v1::ManifestRecord::ADD;
      absl::Time until = absl::FromUnixMillis(static_cast<int64_t>(record.until_ms()));
      // A commit is checked once its writes ended (no byte of the grant can land after
      // that): the range must hold the bytes of the checksum the writer declared. Else it
      // is refused, its grant ended for reads too, and it never enters the manifest.
      std::optional<GrantTable::Landed> landed =
          grants_.End(record.grant(), /*writes_only=*/add, until);
      if (add && record.checksum() != 0 && options_.holds_bytes &&
          !HoldsBytes(record, landed)) {
        grants_.End(record.grant(), /*writes_only=*/false, until);
        refused_seqs_.push_back(seq);
        commits_refused_.fetch_add(1, std::memory_order_relaxed);
        continue;
      }
      applied.push_back(record);
    }
    uint64_t suppressed = 0;
    if (!refused_seqs_.empty() && refusal_log_.Allow(&suppressed)) {
      KVPOOL_LOG(WARNING) << "refused " << refused_seqs_.size()
                          << " commits whose ranges do not hold the bytes of their checksums"
                          << SuppressedNote(suppressed);
    }
    manifest_.Apply(applied);
    acked_seq_ = response.last_seq();
  }
  return absl::OkStatus();
}

bool MasterLink::HoldsBytes(const v1::ManifestRecord& record,
                            const std::optional<GrantTable::Landed>& landed) {
  // A TCP write hashed its bytes as they landed, and nothing has changed the range through
  // the data plane since: a compare. A shared-memory write whose intent covered the range
  // and was done: taken as written (or hashed, with hash_shm_commits). Else (nothing
  // written, RDMA, several or partial writes) the range is hashed now.
  if (landed && landed->offset == record.offset() && landed->length == record.size()) {
    if (landed->hashed) {
      commits_compared_.fetch_add(1, std::memory_order_relaxed);
      return landed->checksum == record.checksum();
    }
    // Written in full by its own grant's shared-memory writer, accepted while the grant was
    // open and alone in the range (GrantTable): no CPU pass over the bytes here.
    if (!options_.hash_shm_commits) {
      commits_by_intent_.fetch_add(1, std::memory_order_relaxed);
      return true;
    }
  }
  commits_hashed_.fetch_add(1, std::memory_order_relaxed);
  return options_.holds_bytes(record.offset(), record.size(), record.checksum());
}

void MasterLink::Unmount() {
  v1::UnmountSegmentRequest request;
  request.set_name(options_.name);
  request.set_incarnation(options_.incarnation);
  v1::UnmountSegmentResponse response;
  grpc::ClientContext context;
  AttachToken(context, options_.auth_token);
  context.set_deadline(absl::ToChronoTime(absl::Now() + options_.rpc_timeout));
  std::string master;
  {
    absl::MutexLock lock(&mu_);
    master = master_;
  }
  grpc::Status status =
      v1::MasterService::NewStub(locator_->Channel(master))->UnmountSegment(&context, request, &response);
  if (status.ok()) {
    KVPOOL_LOG(INFO) << "unmounted from master; " << response.objects_dropped()
                     << " objects lost their last replica";
  } else {
    KVPOOL_LOG(WARNING) << "unmount failed: " << status.error_message();
  }
}

}  // namespace kvpool::segment
