#pragma once

// The segments mounted on the master: who they are, where clients reach them, the secret
// that signs their capability tokens, and the allocator of their pool. Thread-safe.

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/pin_mode.h"
#include "proto/busy_ranges.h"
#include "proto/capability.h"
#include "server/master/range_allocator.h"

namespace kvpool::master {

// Never reused, so a replica that names a segment that went away can never resolve to
// another segment that mounted later under the same name.
using SegmentId = uint64_t;

// One change to a segment's manifest (ManifestSync): an object committed there, or forgotten.
struct ManifestRecord {
  enum class Kind : uint8_t { kAdd = 1, kForget = 2 };
  Kind kind = Kind::kAdd;
  std::string key;
  uint64_t offset = 0;
  uint64_t size = 0;
  uint64_t checksum = 0;
  PinMode pin = PinMode::kNone;
  // The replica's grant (capability tokens carry it), and the latest expiry of any token
  // minted for it: the segment remembers the ended grant until then.
  uint64_t grant = 0;
  absl::Time until = absl::InfinitePast();
};

// What a segment tells the master about itself when it mounts.
struct SegmentInfo {
  std::string name;
  std::string host;
  std::string endpoint;  // data plane, "host:port"
  std::string shm_socket;  // for same-host clients; empty if none
  std::string machine_id;  // kernel boot id
  uint64_t size = 0;
  uint64_t incarnation = 0;
  std::string token_secret;
  // Runs inside the master process: never expires, reports no manifest (it dies with the
  // master).
  bool embedded = false;
  // For an embedded segment: applies a manifest record to it (ends the record's grant, all of
  // it or its writes only, and keeps its manifest for reads by key), as the master appends it.
  std::function<void(const ManifestRecord& record)> apply_record;
  // For an embedded segment: the ranges it holds busy now (GrantTable::BusyRanges), asked
  // after each grant it is told to end and every second (Master::RefreshEmbeddedBusy), in
  // place of a heartbeat's report.
  std::function<std::vector<wire::ByteRange>()> busy_ranges;
  // For an embedded segment: the keys it served by key since the last call
  // (HeartbeatRequest.keys_read), taken every second by Master::RefreshEmbeddedBusy.
  std::function<std::vector<std::string>()> keys_read;
  // It will report a manifest (RestoreManifest): take no new objects until it has.
  bool restoring = false;
  // Ranges it holds busy (late shared-memory writes): held out of its allocator from the
  // mount on (once the manifest is restored, when restoring), until a heartbeat's report
  // replaces them (MountedSegment::ReportBusy). At most wire::kMaxBusyRanges, in the pool.
  std::vector<wire::ByteRange> busy;
};

class MountedSegment {
 public:
  MountedSegment(SegmentId id, SegmentInfo info, absl::Time now);

  SegmentId id() const { return id_; }
  const SegmentInfo& info() const { return info_; }
  // info().token_secret, ready to mint tokens.
  const wire::TokenKey& token_key() const { return token_key_; }
  RangeAllocator& allocator() { return allocator_; }
  const RangeAllocator& allocator() const { return allocator_; }

  void Touch(absl::Time now) { last_heartbeat_ns_.store(absl::ToUnixNanos(now)); }
  absl::Time last_heartbeat() const { return absl::FromUnixNanos(last_heartbeat_ns_.load()); }

  // Set once the registry has let go of the segment (unmounted, expired, replaced). Its
  // replicas are no longer served and are being dropped from the index.
  // Replicas (committed or reserved) that live in this segment.
  uint64_t replica_count() const { return replica_count_.load(std::memory_order_relaxed); }
  void AddReplicas(int64_t delta) { replica_count_.fetch_add(delta, std::memory_order_relaxed); }

  bool removed() const { return removed_.load(std::memory_order_acquire); }

  // A draining segment takes no new objects; it leaves once nothing on it is leased or
  // being written.
  bool draining() const { return draining_.load(std::memory_order_acquire); }
  void MarkDraining() { draining_.store(true, std::memory_order_release); }
  // While a mover copies a draining segment's objects elsewhere (Master::MigrateStart), the
  // drain waits: until the mover is done or silent past this time.
  void SetMoverDeadline(absl::Time deadline) {
    mover_deadline_ns_.store(absl::ToUnixNanos(deadline), std::memory_order_release);
  }
  bool mover_active(absl::Time now) const {
    return absl::FromUnixNanos(mover_deadline_ns_.load(std::memory_order_acquire)) > now;
  }
  bool restoring() const { return restoring_.load(std::memory_order_acquire); }
  // The manifest is restored: takes new objects, and holds the busy ranges of its mount.
  void FinishRestoring();
  // The segment's busy ranges now (its heartbeat's report): its allocator hands out no byte
  // of them until a report no longer lists it. InvalidArgument for a report of more than
  // wire::kMaxBusyRanges ranges or one outside the pool (nothing changes then).
  absl::Status ReportBusy(absl::Span<const wire::ByteRange> busy);
  bool accepts_writes() const { return !removed() && !draining() && !restoring(); }
  void MarkRemoved() { removed_.store(true, std::memory_order_release); }

 private:
  const SegmentId id_;
  const SegmentInfo info_;
  const wire::TokenKey token_key_;
  RangeAllocator allocator_;
  std::atomic<int64_t> last_heartbeat_ns_;
  std::atomic<bool> removed_{false};
  std::atomic<bool> draining_{false};
  std::atomic<int64_t> mover_deadline_ns_{0};
  std::atomic<bool> restoring_;
  std::atomic<int64_t> replica_count_{0};
};

class SegmentRegistry {
 public:
  struct MountResult {
    std::shared_ptr<MountedSegment> segment;
    // True when this exact incarnation was already mounted (a retried mount).
    bool already_mounted = false;
    // The previous incarnation under the same name, now gone with its contents.
    std::optional<SegmentId> replaced;
  };

  // InvalidArgument for an empty name, endpoint or secret, or a size of 0.
  absl::StatusOr<MountResult> Mount(SegmentInfo info, absl::Time now) ABSL_LOCKS_EXCLUDED(mu_);

  // NotFound unless `name` is mounted with `incarnation`. Returns the removed segment's id.
  // `drained`: remembered, so that the segment's next heartbeat is told to stop.
  absl::StatusOr<SegmentId> Unmount(const std::string& name, uint64_t incarnation,
                                    bool drained = false) ABSL_LOCKS_EXCLUDED(mu_);
  bool WasDrained(const std::string& name, uint64_t incarnation) const ABSL_LOCKS_EXCLUDED(mu_);

  // The segment's id, or nullopt when no segment `name` with `incarnation` is mounted.
  std::optional<SegmentId> Heartbeat(const std::string& name, uint64_t incarnation,
                                     absl::Time now) ABSL_LOCKS_EXCLUDED(mu_);

  // The mounted segment with this name (and incarnation), or null.
  std::shared_ptr<MountedSegment> Find(const std::string& name, uint64_t incarnation) const
      ABSL_LOCKS_EXCLUDED(mu_);
  std::shared_ptr<MountedSegment> FindByName(const std::string& name) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // Removes the segments whose last heartbeat is older than `ttl` and returns them.
  // Every way out of the registry marks the segment removed().
  std::vector<std::shared_ptr<MountedSegment>> RemoveExpired(absl::Time now, absl::Duration ttl)
      ABSL_LOCKS_EXCLUDED(mu_);

  // The segment with this id, or null if it is gone.
  std::shared_ptr<MountedSegment> Get(SegmentId id) const ABSL_LOCKS_EXCLUDED(mu_);

  // A snapshot of the mounted segments, in mount order.
  std::vector<std::shared_ptr<MountedSegment>> List() const ABSL_LOCKS_EXCLUDED(mu_);

  // Largest pool of any mounted segment (0 if none).
  uint64_t LargestCapacity() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  mutable absl::Mutex mu_;
  SegmentId next_id_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_map<SegmentId, std::shared_ptr<MountedSegment>> by_id_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, SegmentId> by_name_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<std::pair<std::string, uint64_t>> drained_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvpool::master
