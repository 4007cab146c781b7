#pragma once

// One of Master::kNumShards slices of the object index, chosen by the hash of the key.
// A request holds at most one shard lock at a time (and may take allocator locks under it),
// so there is no lock order between shards to remember. Thread-safe.

#include <cstdint>
#include <memory>
#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "server/master/segment_registry.h"

namespace kvpool::master {

// One copy of an object's bytes: [offset, offset + size) of a segment's pool.
struct Replica {
  std::shared_ptr<MountedSegment> segment;
  uint64_t offset = 0;
};

struct Object {
  uint64_t size = 0;
  // Reservation id from Reserve; Commit and Revoke must present it.
  uint64_t put_id = 0;
  // False from Reserve until Commit: invisible to readers.
  bool committed = false;
  // A reservation not committed by then may be reclaimed.
  absl::Time put_deadline;
  std::vector<Replica> replicas;
};

// What a reader or writer needs to know about an object.
struct ObjectView {
  uint64_t size = 0;
  uint64_t put_id = 0;
  std::vector<Replica> replicas;
};

class IndexShard {
 public:
  // Reserves `replica_num` ranges on distinct segments of `segments` (most free space first;
  // fewer if fewer segments have room, at least one). AlreadyExists if the key is committed
  // or being written; ResourceExhausted if no segment has room.
  absl::StatusOr<ObjectView> Reserve(absl::string_view key, uint64_t size, uint32_t replica_num,
                                     uint64_t put_id,
                                     absl::Span<const std::shared_ptr<MountedSegment>> segments,
                                     absl::Time put_deadline) ABSL_LOCKS_EXCLUDED(mu_);

  // Makes a reservation visible. NotFound unless `key` is reserved with `put_id`;
  // OK if it is already committed with that id (a retried commit).
  absl::Status Commit(absl::string_view key, uint64_t put_id) ABSL_LOCKS_EXCLUDED(mu_);

  // Frees a reservation. NotFound unless `key` is reserved (not committed) with `put_id`.
  absl::Status Revoke(absl::string_view key, uint64_t put_id) ABSL_LOCKS_EXCLUDED(mu_);

  // A committed object with its live replicas. NotFound if absent, not yet committed, or
  // every replica lives on a segment that went away.
  absl::StatusOr<ObjectView> Lookup(absl::string_view key) const ABSL_LOCKS_EXCLUDED(mu_);

  // Removes a committed object and frees its space. NotFound if there is none.
  absl::Status Remove(absl::string_view key) ABSL_LOCKS_EXCLUDED(mu_);

  // Removes every committed object; returns how many.
  uint64_t RemoveAll() ABSL_LOCKS_EXCLUDED(mu_);

  // Drops the replicas that live on removed segments; objects left without a replica are
  // erased (a writer of such a reservation gets NotFound at commit). Returns how many were.
  uint64_t DropRemovedReplicas() ABSL_LOCKS_EXCLUDED(mu_);

  struct Counts {
    uint64_t committed = 0;
    uint64_t pending = 0;
  };
  Counts counts() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  using Map = absl::flat_hash_map<std::string, Object>;

  // Erases the object, returning its space to the allocators when `free_space`.
  void EraseLocked(Map::iterator it, bool free_space) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  Map objects_ ABSL_GUARDED_BY(mu_);
  Counts counts_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvpool::master
