#include "server/master/segment_registry.h"

#include "common/net.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace kvpool::master {

MountedSegment::MountedSegment(SegmentId id, SegmentInfo info, absl::Time now)
    : id_(id),
      info_(std::move(info)),
      token_key_(info_.token_secret),
      allocator_(info_.size),
      last_heartbeat_ns_(absl::ToUnixNanos(now)),
      restoring_(info_.restoring) {
  // The manifest's objects are placed first (RestoreManifest), then the busy ranges.
  if (!info_.restoring) allocator_.SetHeld(info_.busy);
}

void MountedSegment::FinishRestoring() {
  if (restoring_.exchange(false, std::memory_order_acq_rel)) allocator_.SetHeld(info_.busy);
}

absl::Status MountedSegment::ReportBusy(absl::Span<const wire::ByteRange> busy) {
  if (absl::Status valid = wire::ValidateBusyRanges(busy, info_.size); !valid.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("segment ", info_.name, ": ", valid.message()));
  }
  allocator_.SetHeld(busy);
  return absl::OkStatus();
}

absl::StatusOr<SegmentRegistry::MountResult> SegmentRegistry::Mount(SegmentInfo info,
                                                                    absl::Time now) {
  if (info.name.empty()) return absl::InvalidArgumentError("segment name is empty");
  if (info.endpoint.empty()) return absl::InvalidArgumentError("segment endpoint is empty");
  if (info.token_secret.size() < 16) {
    return absl::InvalidArgumentError("segment token secret is shorter than 16 bytes");
  }
  if (info.size < RangeAllocator::kAlignment) {
    return absl::InvalidArgumentError(absl::StrCat("segment size ", info.size, " is too small"));
  }
  // What a segment says about itself is checked like anything else from a socket.
  constexpr uint64_t kMaxSegmentBytes = uint64_t{1} << 50;  // 1 PiB
  constexpr size_t kMaxField = 1024;
  if (info.size > kMaxSegmentBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("segment size ", info.size, " is larger than ", kMaxSegmentBytes));
  }
  if (info.token_secret.size() > kMaxField || info.name.size() > kMaxField ||
      info.endpoint.size() > kMaxField || info.host.size() > kMaxField ||
      info.shm_socket.size() > kMaxField || info.machine_id.size() > kMaxField) {
    return absl::InvalidArgumentError(
        absl::StrCat("a field of the mount is longer than ", kMaxField, " bytes"));
  }
  if (absl::Status busy = wire::ValidateBusyRanges(info.busy, info.size); !busy.ok()) {
    return busy;
  }
  if (!ParseHostPort(info.endpoint).ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("segment endpoint \"", info.endpoint, "\" is not host:port"));
  }
  absl::MutexLock lock(&mu_);
  MountResult result;
  if (auto it = by_name_.find(info.name); it != by_name_.end()) {
    std::shared_ptr<MountedSegment>& existing = by_id_[it->second];
    // The same process with the same secret: a retried mount. A new secret is a new term of
    // the segment (it draws one per mount and refuses the old one's tokens): start afresh.
    if (existing->info().incarnation == info.incarnation &&
        existing->info().token_secret == info.token_secret) {
      existing->Touch(now);
      result.segment = existing;
      result.already_mounted = true;
      return result;
    }
    result.replaced = existing->id();
    existing->MarkRemoved();
    by_id_.erase(existing->id());
    by_name_.erase(it);
  }
  SegmentId id = next_id_++;
  auto segment = std::make_shared<MountedSegment>(id, std::move(info), now);
  by_name_[segment->info().name] = id;
  by_id_[id] = segment;
  result.segment = std::move(segment);
  return result;
}

absl::StatusOr<SegmentId> SegmentRegistry::Unmount(const std::string& name, uint64_t incarnation,
                                                  bool drained) {
  absl::MutexLock lock(&mu_);
  auto it = by_name_.find(name);
  if (it == by_name_.end() || by_id_[it->second]->info().incarnation != incarnation) {
    return absl::NotFoundError(absl::StrCat("segment ", name, " is not mounted"));
  }
  SegmentId id = it->second;
  by_id_[id]->MarkRemoved();
  by_id_.erase(id);
  by_name_.erase(it);
  if (drained) drained_.emplace(name, incarnation);
  return id;
}

bool SegmentRegistry::WasDrained(const std::string& name, uint64_t incarnation) const {
  absl::ReaderMutexLock lock(&mu_);
  return drained_.contains(std::make_pair(name, incarnation));
}

std::shared_ptr<MountedSegment> SegmentRegistry::Find(const std::string& name,
                                                      uint64_t incarnation) const {
  std::shared_ptr<MountedSegment> segment = FindByName(name);
  return segment && segment->info().incarnation == incarnation ? segment : nullptr;
}

std::shared_ptr<MountedSegment> SegmentRegistry::FindByName(const std::string& name) const {
  absl::ReaderMutexLock lock(&mu_);
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : by_id_.at(it->second);
}

std::optional<SegmentId> SegmentRegistry::Heartbeat(const std::string& name,
                                                    uint64_t incarnation, absl::Time now) {
  std::shared_ptr<MountedSegment> segment = Find(name, incarnation);
  if (segment == nullptr) return std::nullopt;
  segment->Touch(now);
  return segment->id();
}

std::vector<std::shared_ptr<MountedSegment>> SegmentRegistry::RemoveExpired(absl::Time now,
                                                                            absl::Duration ttl) {
  std::vector<std::shared_ptr<MountedSegment>> expired;
  absl::MutexLock lock(&mu_);
  for (const auto& [id, segment] : by_id_) {
    if (!segment->info().embedded && now - segment->last_heartbeat() > ttl) {
      expired.push_back(segment);
    }
  }
  for (const auto& segment : expired) {
    segment->MarkRemoved();
    by_id_.erase(segment->id());
    by_name_.erase(segment->info().name);
  }
  return expired;
}

std::shared_ptr<MountedSegment> SegmentRegistry::Get(SegmentId id) const {
  absl::ReaderMutexLock lock(&mu_);
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : it->second;
}

std::vector<std::shared_ptr<MountedSegment>> SegmentRegistry::List() const {
  std::vector<std::shared_ptr<MountedSegment>> segments;
  {
    absl::ReaderMutexLock lock(&mu_);
    segments.reserve(by_id_.size());
    for (const auto& [id, segment] : by_id_) segments.push_back(segment);
  }
  std::sort(segments.begin(), segments.end(),
            [](const auto& a, const auto& b) { return a->id() < b->id(); });
  return segments;
}

uint64_t SegmentRegistry::LargestCapacity() const {
  absl::ReaderMutexLock lock(&mu_);
  uint64_t largest = 0;
  for (const auto& [id, segment] : by_id_) {
    largest = std::max(largest, segment->allocator().capacity());
  }
  return largest;
}

}  // namespace kvpool::master
