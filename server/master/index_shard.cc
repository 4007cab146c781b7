#include "server/master/index_shard.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace kvpool::master {
namespace {

bool Live(const Replica& replica) { return !replica.segment->removed(); }

}  // namespace

absl::StatusOr<ObjectView> IndexShard::Reserve(
    absl::string_view key, uint64_t size, uint32_t replica_num, uint64_t put_id,
    absl::Span<const std::shared_ptr<MountedSegment>> segments, absl::Time put_deadline) {
  absl::MutexLock lock(&mu_);
  if (auto it = objects_.find(key); it != objects_.end()) {
    return absl::AlreadyExistsError(it->second.committed ? "object already exists"
                                                         : "object is being written");
  }
  // Most free space first, so load spreads over the pool.
  std::vector<std::pair<uint64_t, MountedSegment*>> candidates;
  candidates.reserve(segments.size());
  for (const auto& segment : segments) {
    if (segment->removed()) continue;
    const RangeAllocator& allocator = segment->allocator();
    candidates.emplace_back(allocator.capacity() - allocator.used(), segment.get());
  }
  std::stable_sort(candidates.begin(), candidates.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });

  Object object;
  object.size = size;
  object.put_id = put_id;
  object.put_deadline = put_deadline;
  for (const auto& [free_bytes, segment] : candidates) {
    if (object.replicas.size() == replica_num) break;
    if (free_bytes < size) break;  // sorted: nobody after this one has room either
    std::optional<uint64_t> offset = segment->allocator().Allocate(size);
    if (!offset) continue;
    auto owner = std::find_if(segments.begin(), segments.end(),
                              [&](const auto& s) { return s.get() == segment; });
    segment->AddReplicas(1);
    object.replicas.push_back(Replica{*owner, *offset});
  }
  if (object.replicas.empty()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("no segment has ", size, " free bytes for this object"));
  }
  ObjectView view{object.size, object.put_id, object.replicas};
  objects_.emplace(key, std::move(object));
  ++counts_.pending;
  return view;
}

absl::Status IndexShard::Commit(absl::string_view key, uint64_t put_id) {
  absl::MutexLock lock(&mu_);
  auto it = objects_.find(key);
  if (it == objects_.end() || it->second.put_id != put_id) {
    return absl::NotFoundError("no such reservation (revoked, expired or another writer's)");
  }
  if (!it->second.committed) {
    it->second.committed = true;
    --counts_.pending;
    ++counts_.committed;
  }
  return absl::OkStatus();
}

absl::Status IndexShard::Revoke(absl::string_view key, uint64_t put_id) {
  absl::MutexLock lock(&mu_);
  auto it = objects_.find(key);
  if (it == objects_.end() || it->second.put_id != put_id || it->second.committed) {
    return absl::NotFoundError("no such reservation (committed, expired or another writer's)");
  }
  EraseLocked(it, /*free_space=*/true);
  return absl::OkStatus();
}

absl::StatusOr<ObjectView> IndexShard::Lookup(absl::string_view key) const {
  absl::ReaderMutexLock lock(&mu_);
  auto it = objects_.find(key);
  if (it == objects_.end() || !it->second.committed) {
    return absl::NotFoundError("object not found");
  }
  ObjectView view{it->second.size, it->second.put_id, {}};
  for (const Replica& replica : it->second.replicas) {
    if (Live(replica)) view.replicas.push_back(replica);
  }
  if (view.replicas.empty()) return absl::NotFoundError("object lost with its segments");
  return view;
}

absl::Status IndexShard::Remove(absl::string_view key) {
  absl::MutexLock lock(&mu_);
  auto it = objects_.find(key);
  if (it == objects_.end() || !it->second.committed) {
    return absl::NotFoundError("object not found");
  }
  EraseLocked(it, /*free_space=*/true);
  return absl::OkStatus();
}

uint64_t IndexShard::RemoveAll() {
  absl::MutexLock lock(&mu_);
  uint64_t removed = 0;
  for (auto it = objects_.begin(); it != objects_.end();) {
    if (it->second.committed) {
      EraseLocked(it++, /*free_space=*/true);
      ++removed;
    } else {
      ++it;
    }
  }
  return removed;
}

uint64_t IndexShard::DropRemovedReplicas() {
  absl::MutexLock lock(&mu_);
  uint64_t erased = 0;
  for (auto it = objects_.begin(); it != objects_.end();) {
    std::vector<Replica>& replicas = it->second.replicas;
    replicas.erase(std::remove_if(replicas.begin(), replicas.end(),
                                  [](const Replica& r) { return !Live(r); }),
                   replicas.end());
    if (replicas.empty()) {
      EraseLocked(it++, /*free_space=*/false);
      ++erased;
    } else {
      ++it;
    }
  }
  return erased;
}

IndexShard::Counts IndexShard::counts() const {
  absl::ReaderMutexLock lock(&mu_);
  return counts_;
}

void IndexShard::EraseLocked(Map::iterator it, bool free_space) {
  const Object& object = it->second;
  for (const Replica& replica : object.replicas) {
    replica.segment->AddReplicas(-1);
    // Freeing into the allocator of a removed segment is harmless: nobody allocates there.
    if (free_space) replica.segment->allocator().Free(replica.offset, object.size);
  }
  --(object.committed ? counts_.committed : counts_.pending);
  objects_.erase(it);
}

}  // namespace kvpool::master
