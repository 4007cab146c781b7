#pragma once

// Ranges of a segment's pool held busy by late shared-memory writes (docs/semantics.md,
// "Grants"), as the segment reports them to the master with its mount and every heartbeat
// (HeartbeatRequest.busy_ranges): the segment coalesces what it holds into at most
// kMaxBusyRanges ranges, the master checks the report before its allocator keeps out of them.

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace kvpool::wire {

// Bytes [offset, offset + length).
struct ByteRange {
  uint64_t offset = 0;
  uint64_t length = 0;
  uint64_t end() const { return offset + length; }
  friend bool operator==(const ByteRange&, const ByteRange&) = default;
};

// The most ranges one report carries.
inline constexpr size_t kMaxBusyRanges = 64;

// `ranges` (any order, overlapping or not, empty ones ignored) as sorted, disjoint ranges
// covering every byte of them, at most `max_ranges` (above 0): overlapping and touching
// ranges are merged, then, while there are too many, the neighbours with the smallest gap
// between them (the gap included: a report may cover more than is busy, never less).
std::vector<ByteRange> CoalesceRanges(std::vector<ByteRange> ranges, size_t max_ranges);

// InvalidArgument unless the report has at most kMaxBusyRanges ranges, each non-empty and
// inside a pool of `pool_size` bytes.
absl::Status ValidateBusyRanges(absl::Span<const ByteRange> ranges, uint64_t pool_size);

}  // namespace kvpool::wire
