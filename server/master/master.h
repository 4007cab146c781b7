#pragma once

// The master's core: the object index, the mounted segments and the rules of a put and a
// get, with no sockets in sight. The gRPC service (grpc_service.h) is a thin shell over it,
// and tests drive it directly with an injected clock. Thread-safe.
//
// Life of a put: BatchPutStart reserves space and mints write tokens (step P1), the client
// writes the bytes (P2), BatchPutEnd commits (P3). Life of a get: BatchGetReplicaList
// answers placements with read tokens and grants a lease (G1), the client reads (G2).
// docs/data_path.md follows the same steps; docs/semantics.md explains every answer.

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/log_limiter.h"
#include "proto/frame.h"
#include "server/master/index_shard.h"
#include "server/master/manifest_sync.h"
#include "server/master/segment_registry.h"
#include "server/master/tenant_usage.h"

namespace kvpool::master {

struct MasterOptions {
  // Longest key accepted, in bytes.
  uint32_t max_key_bytes = 4096;
  // A reservation not committed within this time is reclaimed; write tokens expire with it.
  absl::Duration put_timeout = absl::Seconds(60);
  // A get or exist leases the object for this long: it is neither evicted nor removed
  // (unless forced) meanwhile, and read tokens are valid as long.
  absl::Duration lease_ttl = absl::Seconds(10);
  // A commit leases the new object for lease_ttl too, as if its writer had read it at once:
  // a fresh object is neither evicted nor removed (unless forced) before its readers come.
  bool lease_on_put = false;
  // Told to segments at mount; a segment silent for segment_ttl is declared dead.
  absl::Duration heartbeat_interval = absl::Seconds(1);
  absl::Duration segment_ttl = absl::Seconds(10);
  // Eviction starts when used/capacity passes the high-water mark, and each round (and each
  // failed allocation) frees this fraction of the capacity.
  double eviction_high_watermark = 0.95;
  double eviction_ratio = 0.05;
  // How long BatchPutEnd and BatchRemove wait for segments to record the change in their
  // manifests (what lets the index be rebuilt after a master restart).
  absl::Duration manifest_sync_timeout = absl::Seconds(2);
  // Byte quota per tenant (tenant_keys.h; tenant_usage.h): a put of a tenant at its quota
  // answers NO_AVAILABLE_HANDLE. Tenants not named have none.
  absl::flat_hash_map<std::string, uint64_t> tenant_quotas;
  // Time source; tests inject their own.
  std::function<absl::Time()> clock = [] { return absl::Now(); };
};

// Where a client writes or reads one replica.
struct PlacementView {
  std::string segment_name;
  std::string host;
  std::string endpoint;
  uint64_t incarnation = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
  // None where the caller asked for none (ReadTokens::kLeftOut).
  std::optional<wire::Token> token;
};

// Whether BatchGetReplicaList mints read tokens: left out for a caller that reads through
// shared memory, where no token is checked.
enum class ReadTokens { kMinted, kLeftOut };

struct PutStartOptions {
  uint32_t replica_num = 1;
  PinMode pin = PinMode::kNone;
  // Segments on this host, or on this machine, are tried first (the writer's own, when it
  // asks).
  std::string preferred_host;
  std::string preferred_machine_id;
  // Segments named here are tried before any other, in this order (Mooncake's
  // preferred_segment(s)); names no mounted segment has are ignored.
  std::vector<std::string> preferred_segments;
  // Who asks (the caller's host as the gRPC peer shows it): only the same caller may commit
  // or revoke the reservation.
  std::string owner;
};

struct PutStartResult {
  // OK, AlreadyExists (dedup), ResourceExhausted (pressure), InvalidArgument (bad key/size).
  absl::Status status;
  uint64_t put_id = 0;
  // Commit before this: the reservation's end, which its write tokens carry too.
  absl::Time deadline = absl::InfinitePast();
  std::vector<PlacementView> placements;
};

struct PutRef {
  std::string key;
  uint64_t put_id = 0;
  uint64_t checksum = 0;
  // The caller (see PutStartOptions::owner).
  std::string caller;
};

struct GetResult {
  // OK, NotFound, or InvalidArgument for a bad key.
  absl::Status status;
  uint64_t size = 0;
  uint64_t checksum = 0;
  // Until when the lease granted with this answer lasts.
  absl::Time lease_expiry;
  std::vector<PlacementView> replicas;
};

// Results of a batch that changes objects, and the manifest records to wait for before
// answering (see ManifestSync): empty when nothing needs to reach a segment.
// Keys of a batch whose commit a segment refused (see ManifestSync::AppendThen), by index in
// the batch, with the result to answer instead. Filled before the batch's ticket is released.
struct Refusals {
  absl::Mutex mu;
  absl::flat_hash_map<size_t, absl::Status> by_index ABSL_GUARDED_BY(mu);
};

template <typename T>
struct Durable {
  std::vector<T> results;
  ManifestSync::Ticket ticket;
  std::shared_ptr<Refusals> refusals = std::make_shared<Refusals>();
};

// One copy a mover makes of a draining segment's object: read `source`, check the checksum,
// write `destination`, report with MigrateEnd.
struct MigrationPlan {
  std::string key;
  uint64_t id = 0;
  uint64_t size = 0;
  uint64_t checksum = 0;
  PlacementView source;
  PlacementView destination;
};

struct MigrateStartResult {
  std::vector<MigrationPlan> migrations;
  // Objects not ready to move now (being written or copied); and those that cannot move.
  uint64_t in_flight = 0;
  uint64_t unplaceable = 0;
};

struct MigrationRef {
  std::string key;
  uint64_t id = 0;
  bool copied = false;
};

struct SegmentSummary {
  std::string name;
  std::string host;
  std::string endpoint;
  std::string shm_socket;
  std::string machine_id;
  uint64_t capacity_bytes = 0;
  uint64_t used_bytes = 0;
  // Held out of the allocator because the segment reports them busy (not in used_bytes).
  uint64_t busy_bytes = 0;
  uint64_t replicas = 0;
  bool embedded = false;
  bool draining = false;
  bool restoring = false;
  absl::Duration heartbeat_age;
  // Master::ListSegments only: a key-read credential of the caller's tenant for this segment
  // (proto/key_read.h), and when it expires.
  std::optional<wire::Token> key_read_credential;
  absl::Time key_read_expiry = absl::InfinitePast();
};

struct ClusterSummary {
  uint64_t capacity_bytes = 0;
  uint64_t used_bytes = 0;
  uint64_t objects = 0;
  uint64_t pending_objects = 0;
  uint64_t soft_pinned = 0;
  uint64_t hard_pinned = 0;
  std::vector<SegmentSummary> segments;
};

// Cumulative counts of background events, for metrics.
struct MasterCounters {
  std::atomic<uint64_t> evicted_objects{0};
  std::atomic<uint64_t> evicted_bytes{0};
  std::atomic<uint64_t> reclaimed_reservations{0};
  std::atomic<uint64_t> segments_expired{0};
  // Commits a segment refused: the range did not hold the bytes of the checksum given.
  std::atomic<uint64_t> commits_refused{0};
};

class Master {
 public:
  static constexpr size_t kNumShards = 64;
  // Hashed with the key to choose its shard (see ShardFor).
  static constexpr uint64_t kShardSalt = 0x6b76706f6f6c;

  explicit Master(MasterOptions options = {});

  const MasterOptions& options() const { return options_; }
  const MasterCounters& counters() const { return counters_; }
  ManifestSync& manifest_sync() { return manifest_sync_; }
  const TenantUsage& tenant_usage() const { return tenant_usage_; }

  // --- Segments ---
  // InvalidArgument for a malformed mount. Mounting a new incarnation under a known name
  // drops the objects of the old one.
  absl::Status MountSegment(SegmentInfo info);
  // Rebuilds index entries from a segment's manifest (after a master restart). Returns the
  // keys refused (conflicting with what the index already holds); the segment forgets them.
  absl::StatusOr<std::vector<std::string>> RestoreManifest(
      const std::string& name, uint64_t incarnation, absl::Span<const ManifestRecord> records);
  // The manifest is complete: the segment takes new objects from now on.
  absl::Status FinishRestore(const std::string& name, uint64_t incarnation);
  // NotFound unless mounted with this incarnation. Returns the objects dropped with it.
  absl::StatusOr<uint64_t> UnmountSegment(const std::string& name, uint64_t incarnation);
  struct HeartbeatReply {
    std::optional<SegmentId> segment;
    bool known = false;
    // The segment was drained and unmounted: it should stop.
    bool drained = false;
  };
  HeartbeatReply Heartbeat(const std::string& name, uint64_t incarnation);
  // The ranges a segment reports busy with its heartbeat (HeartbeatRequest.busy_ranges):
  // nothing is placed there until a report no longer lists them. Call it before the
  // heartbeat's acknowledgements are applied, so a range freed by a FORGET acknowledged in
  // the same heartbeat is held, never handed out. NotFound for a segment no longer mounted,
  // InvalidArgument for a bad report (see MountedSegment::ReportBusy).
  absl::Status ReportBusyRanges(SegmentId segment, absl::Span<const wire::ByteRange> busy);
  // Asks each embedded segment for its busy ranges (SegmentInfo::busy_ranges), as a
  // heartbeat would report them. Called every second.
  void RefreshEmbeddedBusy();
  // Keys (as stored) a segment served by key (HeartbeatRequest.keys_read): each committed
  // object among them with a replica there counts as used now for eviction, as a get would;
  // no lease is taken.
  void TouchKeys(SegmentId segment, absl::Span<const std::string> stored_keys);
  // Stops placing objects on a segment; once nothing on it is leased or being written, its
  // replicas are dropped and it is unmounted (FinishDrains). With `migrate`, that waits for a
  // mover to copy its objects elsewhere first (MigrateStart, MigrateEnd), as long as the mover
  // calls at least once per put_timeout. NotFound for an unknown name.
  absl::Status DrainSegment(const std::string& name, bool migrate = false);
  // The next copies a mover of draining segment `name` should make (at most `max_objects`
  // and no more than `max_bytes` unless one object is larger); when none is answered and none
  // is in flight the mover is done.
  // NotFound for an unknown segment, FailedPrecondition if it is not draining.
  absl::StatusOr<MigrateStartResult> MigrateStart(const std::string& name, size_t max_objects,
                                                  uint64_t max_bytes);
  // Copies made (or failed): a made copy replaces the draining segment's replica, in the
  // manifests too. NotFound per key for a copy the master no longer expects.
  Durable<absl::Status> MigrateEnd(absl::Span<const MigrationRef> refs);
  // One step of a copy or move task (Mooncake's create_copy_task / create_move_task): the
  // copy a mover should make of `key` to the first of `targets` (segment names) without a
  // replica of it, read from any replica (a copy) or from `source` (a move). The codes of
  // IndexShard::StartCopy; with `dry_run` only the checks (an empty plan when OK).
  absl::StatusOr<MigrationPlan> ReplicaCopyStart(const std::string& key,
                                                 absl::Span<const std::string> targets,
                                                 const std::string& source, bool move,
                                                 bool dry_run);
  // Copies of ReplicaCopyStart made (or failed): a made copy becomes a replica (a move's in
  // place of its source's, in one step), in the manifests too. NotFound per key for a copy
  // the master no longer expects, or one that is a drain's (MigrateEnd).
  Durable<absl::Status> ReplicaCopyEnd(absl::Span<const MigrationRef> refs);
  // Declares dead the segments silent for longer than segment_ttl; returns how many.
  size_t ExpireSegments();
  // Unmounts draining segments that hold nothing leased or pending any more.
  size_t FinishDrains();

  // --- Objects: one result per key, in order ---
  // InvalidArgument (whole call) if keys and sizes differ in length.
  absl::StatusOr<std::vector<PutStartResult>> BatchPutStart(absl::Span<const std::string> keys,
                                                            absl::Span<const uint64_t> sizes,
                                                            const PutStartOptions& options);
  Durable<absl::Status> BatchPutEnd(absl::Span<const PutRef> puts);
  std::vector<absl::Status> BatchPutRevoke(absl::Span<const PutRef> puts);
  std::vector<GetResult> BatchGetReplicaList(absl::Span<const std::string> keys,
                                             ReadTokens tokens = ReadTokens::kMinted);
  // True/false per key (a true grants a lease), or InvalidArgument for a bad key.
  std::vector<absl::StatusOr<bool>> BatchExist(absl::Span<const std::string> keys);
  // A key whose removal is not yet durable (a segment holding a replica has not applied its
  // FORGET) answers a retried removal as the removal itself: OK, durable once the ticket is
  // (else WRITE_FAIL again), not OBJECT_NOT_FOUND; see SettleRemovals.
  Durable<absl::Status> BatchRemove(absl::Span<const std::string> keys, bool force);
  // The removals of `keys` were answered as durable: what BatchRemove kept of them for a
  // retry goes, where every segment applied it. Removals answered WRITE_FAIL are kept until
  // applied and at least kRemovalRetryWindow old (ForgetSettledRemovals).
  void SettleRemovals(absl::Span<const std::string> keys) ABSL_LOCKS_EXCLUDED(removals_mu_);
  // How long a removal answered as not durable still answers a retry with OK once applied.
  static constexpr absl::Duration kRemovalRetryWindow = absl::Minutes(10);
  // Removals kept for a retry at most (past it, a retry answers OBJECT_NOT_FOUND).
  static constexpr size_t kMaxUnsettledRemovals = 1 << 20;
  // Per key: its replica on `segment` dropped (IndexShard::DropReplica), InvalidArgument for
  // a bad key or an empty segment name.
  Durable<absl::Status> BatchDropReplicas(absl::Span<const std::string> keys,
                                          const std::string& segment, bool force);
  // Every committed object, or with `key_filter` those whose key it matches somewhere in.
  Durable<uint64_t> RemoveAll(bool force, const RE2* key_filter = nullptr);

  // --- Background work, one worker each ---
  // Evicts eviction_ratio of the capacity if usage is above the high-water mark.
  uint64_t EvictIfAboveHighWatermark();
  // Frees reservations whose writers never committed within put_timeout.
  uint64_t ReclaimExpiredReservations();
  // Forgets removals kept for a retry (see BatchRemove) once applied by every segment and
  // older than kRemovalRetryWindow. Returns how many are kept still.
  size_t ForgetSettledRemovals() ABSL_LOCKS_EXCLUDED(removals_mu_);

  ClusterSummary GetClusterSummary() const;
  // The mounted segments as GetClusterSummary lists them (without the cluster's totals, no
  // scan of the index), each with a key-read credential for `tenant` when one is given (a
  // caller who may read objects), valid for kKeyReadCredentialTtl.
  std::vector<SegmentSummary> ListSegments(std::optional<absl::string_view> tenant) const;
  static constexpr absl::Duration kKeyReadCredentialTtl = absl::Seconds(60);
  // Committed objects under a lease now (scans the index).
  uint64_t CountLeased() const;

 private:
  IndexShard& ShardFor(absl::string_view key);
  SegmentSummary Summarize(const MountedSegment& segment, absl::Time now) const;
  // InvalidArgument (INVALID_KEY) for an empty or too long key.
  absl::Status ValidateKey(absl::string_view key) const;
  // With a token for `opcode` until `expiry`, or none (`mint` false).
  PlacementView MakePlacement(const Replica& replica, uint64_t size, wire::Opcode opcode,
                              absl::Time expiry, bool mint = true) const;
  // Evicts least recently used objects until at least `bytes` are freed or nothing more may
  // go (soft-pinned ones only if `soft_pinned_too`); returns the bytes freed.
  uint64_t Evict(uint64_t bytes, bool soft_pinned_too);
  // Queues "forget" records for removed objects on their segments.
  void ForgetOnSegments(absl::Span<const ObjectView> removed, ManifestSync::Ticket* ticket);
  // Returns the number of objects that lost their last replica.
  uint64_t DropRemovedReplicas();
  // MigrateEnd (a drain's copies) and ReplicaCopyEnd (`requested`: a task's).
  Durable<absl::Status> FinishCopies(absl::Span<const MigrationRef> refs, bool requested);

  const MasterOptions options_;
  SegmentRegistry segments_;
  ManifestSync manifest_sync_;
  std::array<IndexShard, kNumShards> shards_;
  std::atomic<uint64_t> next_put_id_;
  GrantIds grant_ids_;  // put ids, migration ids, grants of restored replicas
  MasterCounters counters_;
  // Refused commits are logged at most once a second (each is counted in counters_).
  LogLimiter refusal_log_;
  // Removals whose FORGET records may not all be applied yet, by key: what a retried
  // BatchRemove of the key waits for.
  struct UnsettledRemoval {
    ManifestSync::Ticket ticket;
    absl::Time removed;
  };
  absl::Mutex removals_mu_;
  absl::flat_hash_map<std::string, UnsettledRemoval> unsettled_removals_
      ABSL_GUARDED_BY(removals_mu_);
  TenantUsage tenant_usage_;
};

}  // namespace kvpool::master
