#pragma once

// The committed objects this segment holds, as the master told it (ManifestRecord ADD and
// FORGET, delivered with heartbeats). When the master restarts, the segment reports this
// list and the master rebuilds its index from it.
//
// Entries are keyed by their offset in the pool. A write never changes the manifest: the
// data plane accepts a write only under an open grant, and the master hands a range out
// again only once the FORGET of its previous object was applied here (GrantTable). An ADD
// drops the entries it overlaps. Thread-safe.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "kvpool/v1/master.pb.h"

namespace kvpool::segment {

class Manifest {
 public:
  // Applies ADD (replacing whatever it overlaps) and FORGET (if the key still matches).
  void Apply(const std::vector<v1::ManifestRecord>& records) ABSL_LOCKS_EXCLUDED(mu_);
  // Drops the entries that overlap [offset, offset + length).
  void DropOverlapping(uint64_t offset, uint64_t length) ABSL_LOCKS_EXCLUDED(mu_);
  // Drops the entries with these keys (refused by the master).
  void Forget(absl::Span<const std::string> keys) ABSL_LOCKS_EXCLUDED(mu_);
  // Every entry, as ADD records, by offset.
  std::vector<v1::ManifestRecord> Entries() const ABSL_LOCKS_EXCLUDED(mu_);
  size_t size() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void DropOverlappingLocked(uint64_t offset, uint64_t length) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  std::map<uint64_t, v1::ManifestRecord> by_offset_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvpool::segment
