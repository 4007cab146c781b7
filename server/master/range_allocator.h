#pragma once

// Hands out byte ranges of one segment's pool: best fit over a set of free ranges, with
// neighbouring free ranges merged on release. Every range is aligned to kAlignment.
// Besides allocated and free bytes it keeps *held* ones: the ranges a segment reports busy
// (SetHeld), which are neither allocated nor handed out until a later report no longer lists
// them. Allocated, free and held bytes never overlap.
// Thread-safe: the master allocates from many index shards at once.

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "proto/busy_ranges.h"

namespace kvpool::master {

class RangeAllocator {
 public:
  static constexpr uint64_t kAlignment = 64;

  explicit RangeAllocator(uint64_t capacity);

  // Offset of a free range of at least `size` bytes (rounded up to kAlignment), or nullopt
  // when no free range is large enough. `size` must be above 0.
  std::optional<uint64_t> Allocate(uint64_t size) ABSL_LOCKS_EXCLUDED(mu_);

  // Takes exactly [offset, offset + size) if it is entirely free (rebuilding the index from
  // a segment's manifest). False if any part of it is allocated or outside the pool.
  bool AllocateAt(uint64_t offset, uint64_t size) ABSL_LOCKS_EXCLUDED(mu_);

  // Returns a range from Allocate (same offset and size) to the free set; the part of it
  // inside a range held now (SetHeld) is held instead.
  void Free(uint64_t offset, uint64_t size) ABSL_LOCKS_EXCLUDED(mu_);

  // The segment's busy ranges now, replacing those of the last call (rounded out to
  // kAlignment, clipped to the pool): from now on no byte of them is handed out until a call
  // no longer lists it. Their free bytes are held at once, their allocated bytes as they are
  // freed; bytes no longer listed go back to the free set. Returns the bytes held now.
  uint64_t SetHeld(absl::Span<const wire::ByteRange> ranges) ABSL_LOCKS_EXCLUDED(mu_);

  uint64_t capacity() const { return capacity_; }
  // Bytes allocated (not counting held ones), and bytes held.
  uint64_t used() const ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t held() const ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t largest_free() const ABSL_LOCKS_EXCLUDED(mu_);

  static uint64_t Rounded(uint64_t size) { return (size + kAlignment - 1) / kAlignment * kAlignment; }

 private:
  void InsertFreeLocked(uint64_t offset, uint64_t size) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EraseFreeLocked(std::map<uint64_t, uint64_t>::iterator it) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Puts [offset, offset + size) into the free set, merged with free neighbours.
  void ReleaseLocked(uint64_t offset, uint64_t size) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Moves the free bytes of [start, end) that lie in a wanted range into held_.
  void HoldFreeLocked(uint64_t start, uint64_t end) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const uint64_t capacity_;
  mutable absl::Mutex mu_;
  // Free ranges by offset (offset -> size) and by (size, offset) for best fit.
  std::map<uint64_t, uint64_t> by_offset_ ABSL_GUARDED_BY(mu_);
  std::set<std::pair<uint64_t, uint64_t>> by_size_ ABSL_GUARDED_BY(mu_);
  uint64_t used_ ABSL_GUARDED_BY(mu_) = 0;
  // The ranges of the last SetHeld (aligned, disjoint, offset -> end), and the pieces of them
  // held now (offset -> size; taken out of the free set).
  std::map<uint64_t, uint64_t> wanted_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, uint64_t> held_ ABSL_GUARDED_BY(mu_);
  uint64_t held_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace kvpool::master
