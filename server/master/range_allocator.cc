#include "server/master/range_allocator.h"

#include <algorithm>
#include <vector>

#include "common/log.h"

namespace kvpool::master {

RangeAllocator::RangeAllocator(uint64_t capacity) : capacity_(capacity / kAlignment * kAlignment) {
  absl::MutexLock lock(&mu_);
  if (capacity_ > 0) InsertFreeLocked(0, capacity_);
}

std::optional<uint64_t> RangeAllocator::Allocate(uint64_t size) {
  KVPOOL_CHECK(size > 0);
  if (size > capacity_) return std::nullopt;
  uint64_t rounded = Rounded(size);
  absl::MutexLock lock(&mu_);
  auto fit = by_size_.lower_bound({rounded, 0});
  if (fit == by_size_.end()) return std::nullopt;
  auto [free_size, offset] = *fit;
  EraseFreeLocked(by_offset_.find(offset));
  if (free_size > rounded) InsertFreeLocked(offset + rounded, free_size - rounded);
  used_ += rounded;
  return offset;
}

bool RangeAllocator::AllocateAt(uint64_t offset, uint64_t size) {
  if (size == 0 || offset % kAlignment != 0 || offset > capacity_) return false;
  uint64_t rounded = Rounded(size);
  if (rounded > capacity_ - offset) return false;
  absl::MutexLock lock(&mu_);
  auto it = by_offset_.upper_bound(offset);
  if (it == by_offset_.begin()) return false;
  --it;
  auto [free_offset, free_size] = *it;
  if (free_offset + free_size < offset + rounded) return false;
  EraseFreeLocked(it);
  if (offset > free_offset) InsertFreeLocked(free_offset, offset - free_offset);
  uint64_t end = offset + rounded;
  if (free_offset + free_size > end) InsertFreeLocked(end, free_offset + free_size - end);
  used_ += rounded;
  return true;
}

void RangeAllocator::Free(uint64_t offset, uint64_t size) {
  uint64_t rounded = Rounded(size);
  absl::MutexLock lock(&mu_);
  KVPOOL_CHECK(offset + rounded <= capacity_ && used_ >= rounded)
      << "free of a range that was never allocated: " << offset << "+" << rounded;
  used_ -= rounded;
  ReleaseLocked(offset, rounded);
  if (!wanted_.empty()) HoldFreeLocked(offset, offset + rounded);
}

void RangeAllocator::ReleaseLocked(uint64_t offset, uint64_t size) {
  uint64_t start = offset;
  uint64_t end = offset + size;
  auto next = by_offset_.lower_bound(offset);
  KVPOOL_CHECK(next == by_offset_.end() || next->first >= end) << "double free at " << offset;
  if (next != by_offset_.end() && next->first == end) {
    end += next->second;
    EraseFreeLocked(next);
  }
  auto prev = by_offset_.lower_bound(offset);
  if (prev != by_offset_.begin()) {
    --prev;
    KVPOOL_CHECK(prev->first + prev->second <= start) << "double free at " << offset;
    if (prev->first + prev->second == start) {
      start = prev->first;
      EraseFreeLocked(prev);
    }
  }
  InsertFreeLocked(start, end - start);
}

uint64_t RangeAllocator::SetHeld(absl::Span<const wire::ByteRange> ranges) {
  // Rounded out to whole alignment units (a busy byte anywhere in a unit keeps it out),
  // clipped to the pool, sorted and merged.
  std::vector<wire::ByteRange> aligned;
  aligned.reserve(ranges.size());
  for (const wire::ByteRange& range : ranges) {
    if (range.length == 0 || range.offset >= capacity_) continue;
    uint64_t start = range.offset / kAlignment * kAlignment;
    uint64_t end = range.length >= capacity_ - range.offset ? capacity_ : Rounded(range.end());
    aligned.push_back({start, std::min(end, capacity_) - start});
  }
  std::vector<wire::ByteRange> merged = wire::CoalesceRanges(std::move(aligned), ranges.size() + 1);
  std::map<uint64_t, uint64_t> wanted;
  for (const wire::ByteRange& range : merged) wanted.emplace(range.offset, range.end());
  absl::MutexLock lock(&mu_);
  if (wanted == wanted_) return held_bytes_;
  for (const auto& [offset, size] : held_) ReleaseLocked(offset, size);
  held_.clear();
  held_bytes_ = 0;
  wanted_ = std::move(wanted);
  for (const auto& [start, end] : wanted_) HoldFreeLocked(start, end);
  return held_bytes_;
}

void RangeAllocator::HoldFreeLocked(uint64_t start, uint64_t end) {
  // Every wanted range overlapping [start, end), and within it every free range.
  auto want = wanted_.upper_bound(start);
  if (want != wanted_.begin()) --want;
  for (; want != wanted_.end() && want->first < end; ++want) {
    uint64_t from = std::max(start, want->first);
    uint64_t to = std::min(end, want->second);
    if (from >= to) continue;
    auto free = by_offset_.upper_bound(from);
    if (free != by_offset_.begin()) --free;
    while (free != by_offset_.end() && free->first < to) {
      auto [free_offset, free_size] = *free;
      uint64_t take_from = std::max(from, free_offset);
      uint64_t take_to = std::min(to, free_offset + free_size);
      if (take_from >= take_to) {
        ++free;
        continue;
      }
      EraseFreeLocked(free);
      if (take_from > free_offset) InsertFreeLocked(free_offset, take_from - free_offset);
      if (free_offset + free_size > take_to) {
        InsertFreeLocked(take_to, free_offset + free_size - take_to);
      }
      held_.emplace(take_from, take_to - take_from);
      held_bytes_ += take_to - take_from;
      free = by_offset_.lower_bound(take_to);
    }
  }
}

uint64_t RangeAllocator::used() const {
  absl::MutexLock lock(&mu_);
  return used_;
}

uint64_t RangeAllocator::held() const {
  absl::MutexLock lock(&mu_);
  return held_bytes_;
}

uint64_t RangeAllocator::largest_free() const {
  absl::MutexLock lock(&mu_);
  return by_size_.empty() ? 0 : by_size_.rbegin()->first;
}

void RangeAllocator::InsertFreeLocked(uint64_t offset, uint64_t size) {
  by_offset_.emplace(offset, size);
  by_size_.emplace(size, offset);
}

void RangeAllocator::EraseFreeLocked(std::map<uint64_t, uint64_t>::iterator it) {
  by_size_.erase({it->second, it->first});
  by_offset_.erase(it);
}

}  // namespace kvpool::master
