#pragma once

// The committed objects this segment holds, as the master told it (ManifestRecord ADD and
// FORGET, delivered with heartbeats). When the master restarts, the segment reports this
// list and the master rebuilds its index from it.
//
// Entries are keyed by their offset in the pool. A write never changes the manifest: the
// data plane accepts a write only under an open grant, and the master hands a range out
// again only once the FORGET of its previous object was applied here (GrantTable). An ADD
// drops the entries it overlaps. Entries are found by key too, for reads by key (READ_KEY,
// proto/key_read.h). Thread-safe.

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "kvpool/v1/master.pb.h"

namespace kvpool::segment {

class Manifest {
 public:
  // `on_drop` runs for each entry that leaves the manifest, after it left and under the
  // manifest's lock (it must not call back into the manifest): the segment cuts reads by key
  // of the range there (GrantTable::CutKeyReads).
  explicit Manifest(std::function<void(uint64_t offset, uint64_t size)> on_drop = nullptr)
      : on_drop_(std::move(on_drop)) {}

  // Applies ADD (replacing whatever it overlaps) and FORGET (if the key still matches).
  void Apply(const std::vector<v1::ManifestRecord>& records) ABSL_LOCKS_EXCLUDED(mu_);
  // Drops the entries that overlap [offset, offset + length).
  void DropOverlapping(uint64_t offset, uint64_t length) ABSL_LOCKS_EXCLUDED(mu_);
  // Drops the entries with these keys (refused by the master).
  void Forget(absl::Span<const std::string> keys) ABSL_LOCKS_EXCLUDED(mu_);
  // The object stored under `stored_key` (in its tenant's namespace), if this segment holds it.
  struct Found {
    uint64_t offset = 0;
    uint64_t size = 0;
    uint64_t checksum = 0;
    uint64_t grant = 0;
  };
  std::optional<Found> Find(absl::string_view stored_key) const ABSL_LOCKS_EXCLUDED(mu_);
  // Whether `found` (from Find) is still the entry of `stored_key`.
  bool Holds(absl::string_view stored_key, const Found& found) const ABSL_LOCKS_EXCLUDED(mu_);
  // Reads by key are invisible to the master, whose LRU decides what to evict: the data server
  // notes the keys it served (NoteRead), and each heartbeat takes them to the master
  // (TakeReads, HeartbeatRequest.keys_read), which counts each as a use of the object. At most
  // kMaxReadsNoted distinct keys wait; more are not noted until the next take (a key read often
  // is noted again).
  static constexpr size_t kMaxReadsNoted = 1024;
  void NoteRead(absl::string_view stored_key) ABSL_LOCKS_EXCLUDED(reads_mu_);
  std::vector<std::string> TakeReads() ABSL_LOCKS_EXCLUDED(reads_mu_);
  // Every entry, as ADD records, by offset.
  std::vector<v1::ManifestRecord> Entries() const ABSL_LOCKS_EXCLUDED(mu_);
  size_t size() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  using Entries_ = std::map<uint64_t, v1::ManifestRecord>;
  void DropOverlappingLocked(uint64_t offset, uint64_t length) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Entries_::iterator EraseLocked(Entries_::iterator it) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::function<void(uint64_t offset, uint64_t size)> on_drop_;
  mutable absl::Mutex mu_;
  Entries_ by_offset_ ABSL_GUARDED_BY(mu_);
  // Each key's entry (std::map keeps it in place until it is erased): a read by key finds
  // its entry with one hash lookup, no walk down the offset tree.
  absl::flat_hash_map<std::string, Entries_::const_iterator> by_key_ ABSL_GUARDED_BY(mu_);
  absl::Mutex reads_mu_;
  absl::flat_hash_set<std::string> reads_ ABSL_GUARDED_BY(reads_mu_);
};

}  // namespace kvpool::segment
