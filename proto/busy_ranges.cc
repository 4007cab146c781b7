#include "proto/busy_ranges.h"

#include <algorithm>
#include <numeric>

#include "absl/strings/str_cat.h"

namespace kvpool::wire {

std::vector<ByteRange> CoalesceRanges(std::vector<ByteRange> ranges, size_t max_ranges) {
  if (max_ranges == 0) max_ranges = 1;
  std::erase_if(ranges, [](const ByteRange& r) { return r.length == 0; });
  std::sort(ranges.begin(), ranges.end(),
            [](const ByteRange& a, const ByteRange& b) { return a.offset < b.offset; });
  std::vector<ByteRange> merged;
  for (const ByteRange& range : ranges) {
    if (!merged.empty() && range.offset <= merged.back().end()) {
      uint64_t end = std::max(merged.back().end(), range.end());
      merged.back().length = end - merged.back().offset;
    } else {
      merged.push_back(range);
    }
  }
  if (merged.size() <= max_ranges) return merged;
  // Close the (size - max) smallest gaps: gap i lies between merged[i] and merged[i + 1].
  std::vector<size_t> gaps(merged.size() - 1);
  std::iota(gaps.begin(), gaps.end(), 0);
  auto gap = [&](size_t i) { return merged[i + 1].offset - merged[i].end(); };
  size_t to_close = merged.size() - max_ranges;
  std::nth_element(gaps.begin(), gaps.begin() + (to_close - 1), gaps.end(),
                   [&](size_t a, size_t b) { return gap(a) < gap(b) || (gap(a) == gap(b) && a < b); });
  std::vector<bool> close(merged.size() - 1, false);
  for (size_t i = 0; i < to_close; ++i) close[gaps[i]] = true;
  std::vector<ByteRange> out;
  out.reserve(max_ranges);
  for (size_t i = 0; i < merged.size(); ++i) {
    if (i > 0 && close[i - 1]) {
      out.back().length = merged[i].end() - out.back().offset;
    } else {
      out.push_back(merged[i]);
    }
  }
  return out;
}

absl::Status ValidateBusyRanges(absl::Span<const ByteRange> ranges, uint64_t pool_size) {
  if (ranges.size() > kMaxBusyRanges) {
    return absl::InvalidArgumentError(absl::StrCat("busy ranges: ", ranges.size(),
                                                   " reported, at most ", kMaxBusyRanges));
  }
  for (const ByteRange& range : ranges) {
    if (range.length == 0 || range.offset > pool_size || range.length > pool_size - range.offset) {
      return absl::InvalidArgumentError(absl::StrCat("busy range [", range.offset, ", +",
                                                     range.length, ") is not inside the pool of ",
                                                     pool_size, " bytes"));
    }
  }
  return absl::OkStatus();
}

}  // namespace kvpool::wire
