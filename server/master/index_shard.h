#pragma once

// One of Master::kNumShards slices of the object index, chosen by the hash of the key.
// A request holds at most one shard lock at a time (and may take allocator locks under it),
// so there is no lock order between shards to remember. Thread-safe.
//
// An object is first *pending* (reserved by BatchPutStart, invisible to readers, reclaimed
// after its deadline) and then *committed* (visible, evictable unless leased or pinned).
// Committed objects are kept in least-recently-used order for eviction.

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/node_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/pin_mode.h"
#include "re2/re2.h"
#include "server/master/object_list.h"
#include "server/master/segment_registry.h"

namespace kvpool::master {

// One copy of an object's bytes: [offset, offset + size) of a segment's pool.
struct Replica {
  std::shared_ptr<MountedSegment> segment;
  uint64_t offset = 0;
  // Random, drawn when the range was handed out: every capability token for this replica
  // carries it, and the segment refuses it once the master has ended it (ManifestSync).
  uint64_t grant = 0;
  // The segment has applied the commit's ADD: no write token of the grant is honoured any more.
  bool writes_fenced = false;
};

// Grant and put ids: random (OpenSSL's generator), never 0. Drawn a block at a time, since a
// RAND_bytes call costs about a microsecond whatever its size, and a reservation needs two
// ids per key (a quarter of the master's CPU under 512-key BatchPutStart calls). Thread-safe.
class GrantIds {
 public:
  uint64_t Next() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  static constexpr size_t kBlock = 512;
  absl::Mutex mu_;
  std::array<uint64_t, kBlock> ids_ ABSL_GUARDED_BY(mu_);
  size_t next_ ABSL_GUARDED_BY(mu_) = kBlock;
};

// A copy of a committed object on its way from a draining segment to another one
// (Master::MigrateStart), or to a named segment for a copy or move task
// (Master::ReplicaCopyStart: `requested`); the mover's write token for `destination` expires
// at `deadline`. A finished copy replaces the source's replica unless `keep_source` (a
// task's copy, as opposed to a move or a drain).
struct Migration {
  uint64_t id = 0;
  const MountedSegment* source = nullptr;
  Replica destination;
  absl::Time deadline;
  bool requested = false;
  bool keep_source = false;
};

// A copy or move task's step (IndexShard::StartCopy).
struct CopyRequest {
  // Resolved by name, in the caller's order; null for a name no mounted segment has.
  std::vector<std::shared_ptr<MountedSegment>> targets;
  std::vector<std::string> target_names;
  // A move's source segment (its replica is replaced); empty for a copy.
  std::string source;
  bool move = false;
  // Check only; reserve nothing.
  bool dry_run = false;
  uint64_t id = 0;
  absl::Time deadline;
};

struct Object {
  const std::string* key = nullptr;  // the map's own key (node_hash_map: stable)
  uint64_t size = 0;
  // Reservation id from Reserve (random); Commit and Revoke must present it, from the same
  // caller (`owner`: the host the reservation was asked from).
  uint64_t put_id = 0;
  std::string owner;
  // Of the whole value, computed by the writer (XXH3-64), 0 if none was given.
  uint64_t checksum = 0;
  bool committed = false;
  PinMode pin = PinMode::kNone;
  // Pending: reclaimed after this. Committed: unused.
  absl::Time put_deadline;
  // Committed: neither evicted nor removed (unless forced) before this.
  absl::Time lease_expiry = absl::InfinitePast();
  // Position in the global order of accesses (commit, get, exist): eviction takes the
  // smallest first, across all shards.
  uint64_t last_access = 0;
  std::vector<Replica> replicas;
  // Committed, being copied off a draining segment; and how many such copies failed.
  std::optional<Migration> migration;
  uint8_t failed_migrations = 0;
  // Links in the shard's pending list or LRU list (see ObjectList).
  Object* prev = nullptr;
  Object* next = nullptr;
};

// What a caller may know about an object, copied out of the shard.
struct ObjectView {
  std::string key;
  uint64_t size = 0;
  uint64_t put_id = 0;
  uint64_t checksum = 0;
  PinMode pin = PinMode::kNone;
  absl::Time lease_expiry;
  std::vector<Replica> replicas;
};

struct ReserveRequest {
  uint64_t size = 0;
  uint32_t replica_num = 1;
  uint64_t put_id = 0;
  std::string owner;
  PinMode pin = PinMode::kNone;
  absl::Time put_deadline;
};

// MigrationView: one copy started by IndexShard::StartMigrations.
struct MigrationView {
  std::string key;
  uint64_t size = 0;
  uint64_t checksum = 0;
  Replica source;
  Migration migration;
};

struct MigrationBatch {
  std::vector<MigrationView> started;
  uint64_t started_bytes = 0;
  // No more fit: the rest waits for the next batch.
  bool full = false;
  // Objects on the segment being written, or being copied already.
  uint64_t in_flight = 0;
  // Objects no target has room for, or whose copies failed too often.
  uint64_t unplaceable = 0;
};

// A finished copy: the object as it is now, and the draining segment's replica it replaced.
struct FinishedMigration {
  ObjectView object;
  Replica destination;
  std::optional<Replica> dropped_source;
};

class IndexShard {
 public:
  // Copies of an object that fail this often are not tried again.
  static constexpr uint8_t kMaxFailedMigrations = 3;

  // Gives a range back whose grant ended (`key` is the object's, empty for a copy that was
  // never committed; no token of the grant is valid after `until`; `tokens_live`: some may
  // still be honoured now). The master's releaser ends the grant on the segment and, while
  // tokens may be live, frees the range only once the segment has applied that; without a
  // releaser the range is freed at once. Called with the shard lock held.
  using Releaser = std::function<void(const Replica& replica, uint64_t size,
                                      const std::string& key, absl::Time until,
                                      bool tokens_live)>;
  void SetReleaser(Releaser releaser) { releaser_ = std::move(releaser); }
  // Told of every object added (+size, at reservation or restore) and erased (-size), for
  // per-tenant byte accounting (tenant_usage.h). Called with the shard lock held.
  using UsageHook = std::function<void(absl::string_view key, int64_t delta)>;
  void SetUsageHook(UsageHook hook) { usage_hook_ = std::move(hook); }

  // Reserves `replica_num` ranges on distinct segments, trying `segments` in the given
  // order (fewer replicas if fewer segments have room; at least one). AlreadyExists if the
  // key is committed or being written; ResourceExhausted if no segment has room.
  absl::StatusOr<ObjectView> Reserve(absl::string_view key, const ReserveRequest& request,
                                     absl::Span<const std::shared_ptr<MountedSegment>> segments)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Makes a reservation visible, leased until now + `lease` (none if zero), and returns it.
  // NotFound unless `key` is reserved with `put_id`; a retried commit of the same reservation
  // is OK (and leases nothing more). `caller` must be the reservation's owner.
  absl::StatusOr<ObjectView> Commit(absl::string_view key, uint64_t put_id, uint64_t checksum,
                                    absl::Time now, absl::string_view caller = "",
                                    absl::Duration lease = absl::ZeroDuration())
      ABSL_LOCKS_EXCLUDED(mu_);

  // The segment holding `key`'s replica of `grant` has applied its commit (writes ended).
  void MarkWritesFenced(absl::string_view key, uint64_t grant) ABSL_LOCKS_EXCLUDED(mu_);

  // The segment holding `key`'s replica of `grant` refused its commit (the range does not
  // hold the bytes of the checksum): the object is dropped and its space freed (after the
  // segment applies the FORGET). False if `key` no longer has a replica of `grant`.
  bool DropRefused(absl::string_view key, uint64_t grant) ABSL_LOCKS_EXCLUDED(mu_);

  // Frees a reservation. NotFound unless `key` is reserved (not committed) with `put_id`.
  absl::Status Revoke(absl::string_view key, uint64_t put_id, absl::string_view caller = "")
      ABSL_LOCKS_EXCLUDED(mu_);

  // A committed object with its live replicas (the view's key left empty: the caller has it);
  // grants (extends) a lease until now + `lease` and counts as an access. NotFound if absent,
  // not yet committed, or every replica lives on a segment that went away.
  absl::StatusOr<ObjectView> Lookup(absl::string_view key, absl::Time now, absl::Duration lease)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Counts the committed object of `key`, if it has a replica on `segment`, as used now (LRU),
  // without a lease.
  void Touch(absl::string_view key, SegmentId segment) ABSL_LOCKS_EXCLUDED(mu_);

  // Like Lookup, without copying anything out.
  bool Exists(absl::string_view key, absl::Time now, absl::Duration lease) ABSL_LOCKS_EXCLUDED(mu_);

  // Removes a committed object and frees its space. NotFound if there is none;
  // FailedPrecondition (OBJECT_HAS_LEASE) if it is leased and not `force`.
  absl::StatusOr<ObjectView> Remove(absl::string_view key, absl::Time now, bool force)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Drops a committed object's replica on the segment named `segment` and returns the object
  // as it was with only that replica; the object is erased if it was its only one. NotFound
  // if there is no such object or it has no replica there; OBJECT_HAS_LEASE if a reader
  // holds a lease (unless `force`) or it is being copied off a draining segment.
  absl::StatusOr<ObjectView> DropReplica(absl::string_view key, absl::string_view segment,
                                         absl::Time now, bool force) ABSL_LOCKS_EXCLUDED(mu_);

  // Removes every committed object (leased ones only if `force`) and returns them; with
  // `key_filter`, only those whose key it matches somewhere in (RE2::PartialMatch).
  std::vector<ObjectView> RemoveAll(absl::Time now, bool force,
                                    const RE2* key_filter = nullptr)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Eviction, one object at a time, least recently used first. Never leased, hard-pinned or
  // pending objects; soft-pinned ones only if `soft_pinned_too`. Each looks at most
  // `scan_limit` objects from the least recently used end.
  // The access position (Object::last_access) of the object EvictOldest would take.
  std::optional<uint64_t> OldestEvictable(absl::Time now, bool soft_pinned_too,
                                          size_t scan_limit) const ABSL_LOCKS_EXCLUDED(mu_);
  std::optional<ObjectView> EvictOldest(absl::Time now, bool soft_pinned_too, size_t scan_limit)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Frees reservations whose deadline passed, and the space of abandoned copies whose
  // deadline passed; returns how many reservations.
  uint64_t ReclaimExpired(absl::Time now) ABSL_LOCKS_EXCLUDED(mu_);

  // Drops the replicas that live on removed segments; objects left without a replica are
  // erased (a writer of such a reservation gets NotFound at commit). Returns how many were.
  uint64_t DropRemovedReplicas() ABSL_LOCKS_EXCLUDED(mu_);

  // For a draining segment: drops its replicas of committed objects that are not leased
  // (freeing their space; objects left without a replica are erased) and returns how many
  // replicas it still holds (leased, or of objects being written).
  uint64_t ReleaseReplicasOn(const MountedSegment& segment, absl::Time now)
      ABSL_LOCKS_EXCLUDED(mu_);

  // For a draining segment `from`: starts copies of its committed objects, each to the first
  // of `targets` that has room and holds no replica of the object, until `batch` holds
  // `max_objects`, or the next would take it past `max_bytes` (it holds at least one). An object being copied is leased
  // until `deadline` (not evicted, not removed unless forced). Copies whose deadline passed
  // are given back and started again. Ids come from `ids`.
  void StartMigrations(const MountedSegment& from,
                       absl::Span<const std::shared_ptr<MountedSegment>> targets,
                       size_t max_objects, uint64_t max_bytes, absl::Time now,
                       absl::Time deadline, std::atomic<uint64_t>& ids, MigrationBatch& batch)
      ABSL_LOCKS_EXCLUDED(mu_);

  // A copy or move task's next step for `key` (proto: ReplicaCopyStartResponse's codes):
  // starts a copy to the first target without a replica of the object, leased until
  // request.deadline like a drain's. NotFound (no committed object), INVALID_PARAMS (no
  // targets, an unknown target, a move's source equal to its target or without a replica),
  // UNAVAILABLE_IN_CURRENT_STATUS (a target takes no new objects), AlreadyExists (every
  // target holds a replica), OBJECT_HAS_LEASE (another copy of the object is in flight),
  // NO_AVAILABLE_HANDLE (the target has no room). With request.dry_run, OK once valid.
  absl::StatusOr<MigrationView> StartCopy(absl::string_view key, const CopyRequest& request,
                                          absl::Time now) ABSL_LOCKS_EXCLUDED(mu_);

  // Ends copy `id` of `key`: when `copied`, its destination becomes a replica (in place of
  // the source's unless the copy keeps it); else its space is given back. NotFound if there
  // is no such copy any more (the object was removed, or the deadline passed), or if the copy
  // is not of the kind asked for (`requested`: a task's, else a drain's).
  absl::StatusOr<FinishedMigration> FinishMigration(absl::string_view key, uint64_t id,
                                                    bool copied, absl::Time now,
                                                    bool requested = false)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Adds a committed replica reported by a segment's manifest after a master restart.
  // AlreadyExists if the key is known with a different size or checksum, or already has a
  // replica on that segment.
  // Takes the replica's range in its segment's allocator.
  absl::Status Restore(absl::string_view key, uint64_t size, uint64_t checksum, PinMode pin,
                       const Replica& replica) ABSL_LOCKS_EXCLUDED(mu_);

  struct Counts {
    uint64_t committed = 0;
    uint64_t pending = 0;
    uint64_t soft_pinned = 0;
    uint64_t hard_pinned = 0;
  };
  Counts counts() const ABSL_LOCKS_EXCLUDED(mu_);
  // Committed objects whose lease has not run out (scans the shard).
  uint64_t CountLeased(absl::Time now) const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  using Map = absl::node_hash_map<std::string, Object>;

  static ObjectView View(const Object& object);
  // Marks an access: the object becomes the most recently used.
  // The object under `key` if it is committed, else objects_.end().
  Map::iterator FindCommittedLocked(absl::string_view key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void TouchLocked(Object& object) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Object* OldestEvictableLocked(absl::Time now, bool soft_pinned_too, size_t scan_limit) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Erases the object, returning its space to the allocators when `free_space`.
  void EraseLocked(Map::iterator it, bool free_space) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CountPinLocked(PinMode pin, int delta) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops an object's copy in progress. Its space is given back only once its deadline has
  // passed (ReclaimExpired): until then a mover may still write there.
  void AbandonMigrationLocked(Object& object) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReleaseLocked(const Replica& replica, uint64_t size, const std::string& key,
                     absl::Time until, bool tokens_live) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether a token of the object's replica may still be honoured by its segment.
  static bool TokensLive(const Object& object, const Replica& replica, absl::Time now);
  // The latest `now` a caller gave the shard (for decisions made without one).
  absl::Time last_now_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();

  Releaser releaser_;
  UsageHook usage_hook_;
  GrantIds grant_ids_;

  mutable absl::Mutex mu_;
  Map objects_ ABSL_GUARDED_BY(mu_);
  // Pending objects, oldest deadline first (deadlines grow with insertion order).
  ObjectList<Object> pending_ ABSL_GUARDED_BY(mu_);
  // Committed objects, least recently used first.
  ObjectList<Object> lru_ ABSL_GUARDED_BY(mu_);
  Counts counts_ ABSL_GUARDED_BY(mu_);
  // Destinations of abandoned copies, freed once their deadline passed.
  struct AbandonedCopy {
    Replica destination;
    uint64_t size = 0;
    absl::Time deadline;
  };
  std::vector<AbandonedCopy> abandoned_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvpool::master
