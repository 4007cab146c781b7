#include "server/master/index_shard.h"

#include <algorithm>
#include <atomic>

#include <openssl/rand.h>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "proto/error_codes.h"

namespace kvpool::master {
namespace {

bool Live(const Replica& replica) { return !replica.segment->removed(); }

bool Leased(const Object& object, absl::Time now) { return object.lease_expiry > now; }

bool Migrating(const Object& object, absl::Time now) {
  return object.migration.has_value() && object.migration->deadline > now;
}

// Neither evicted nor removed unless forced: leased by a reader, or being copied.
bool Held(const Object& object, absl::Time now) {
  return Leased(object, now) || Migrating(object, now);
}

std::vector<Replica>::iterator ReplicaOn(std::vector<Replica>& replicas,
                                         const MountedSegment* segment) {
  return std::find_if(replicas.begin(), replicas.end(),
                      [&](const Replica& r) { return r.segment.get() == segment; });
}

// The global order of accesses, shared by every shard (and every master in a process).
std::atomic<uint64_t> access_clock{0};

// No token of the object's grants is valid after this.
absl::Time GrantsEnd(const Object& object) {
  absl::Time until = std::max(object.put_deadline, object.lease_expiry);
  if (object.migration) until = std::max(until, object.migration->deadline);
  return until;
}

}  // namespace

uint64_t GrantIds::Next() {
  absl::MutexLock lock(&mu_);
  uint64_t id = 0;
  while (id == 0) {
    if (next_ == kBlock) {
      KVPOOL_CHECK(RAND_bytes(reinterpret_cast<uint8_t*>(ids_.data()), sizeof(ids_)) == 1)
          << "no randomness for grant ids";
      next_ = 0;
    }
    id = ids_[next_];
    ids_[next_++] = 0;  // handed out once
  }
  return id;
}

// Clocks of master and segments may differ this much.
constexpr absl::Duration kClockSlack = absl::Seconds(1);

bool IndexShard::TokensLive(const Object& object, const Replica& replica, absl::Time now) {
  bool reads_live = object.lease_expiry + kClockSlack > now ||
                    (object.migration && object.migration->deadline + kClockSlack > now);
  // An uncommitted reservation's writes stay live past its deadline: a shared-memory writer
  // whose intent the segment accepted in time may still be copying, and only the segment
  // knows. Its range is freed once the segment has applied the FORGET, and the heartbeat
  // that acknowledges it reports the range busy if so (docs/semantics.md, "Grants").
  bool writes_live =
      !replica.writes_fenced && (!object.committed || object.put_deadline + kClockSlack > now);
  return reads_live || writes_live;
}

void IndexShard::ReleaseLocked(const Replica& replica, uint64_t size, const std::string& key,
                               absl::Time until, bool tokens_live) {
  if (releaser_) {
    releaser_(replica, size, key, until, tokens_live);
  } else {
    replica.segment->allocator().Free(replica.offset, size);
  }
}

void IndexShard::MarkWritesFenced(absl::string_view key, uint64_t grant) {
  absl::MutexLock lock(&mu_);
  auto it = objects_.find(key);
  if (it == objects_.end()) return;
  for (Replica& replica : it->second.replicas) {
    if (replica.grant == grant) replica.writes_fenced = true;
  }
}

bool IndexShard::DropRefused(absl::string_view key, uint64_t grant) {
  absl::MutexLock lock(&mu_);
  auto it = objects_.find(key);
  if (it == objects_.end()) return false;
  bool ours = std::any_of(it->second.replicas.begin(), it->second.replicas.end(),
                          [grant](const Replica& replica) { return replica.grant == grant; });
  if (ours) EraseLocked(it, /*free_space=*/true);
  return ours;
}

ObjectView IndexShard::View(const Object& object) {
  return ObjectView{*object.key,  object.size,         object.put_id,  object.checksum,
                    object.pin,   object.lease_expiry, object.replicas};
}

absl::StatusOr<ObjectView> IndexShard::Reserve(
    absl::string_view key, const ReserveRequest& request,
    absl::Span<const std::shared_ptr<MountedSegment>> segments) {
  absl::MutexLock lock(&mu_);
  if (auto it = objects_.find(key); it != objects_.end()) {
    return absl::AlreadyExistsError(it->second.committed ? "object already exists"
                                                         : "object is being written");
  }
  std::vector<Replica> replicas;
  for (const std::shared_ptr<MountedSegment>& segment : segments) {
    if (replicas.size() == request.replica_num) break;
    if (!segment->accepts_writes()) continue;
    std::optional<uint64_t> offset = segment->allocator().Allocate(request.size);
    if (!offset) continue;
    segment->AddReplicas(1);
    replicas.push_back(Replica{segment, *offset, grant_ids_.Next()});
  }
  if (replicas.empty()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("no segment has ", request.size, " free bytes for this object"));
  }
  auto [it, inserted] = objects_.try_emplace(key);
  Object& object = it->second;
  object.key = &it->first;
  object.size = request.size;
  object.put_id = request.put_id;
  object.owner = request.owner;
  object.pin = request.pin;
  object.put_deadline = request.put_deadline;
  object.replicas = std::move(replicas);
  pending_.PushBack(&object);
  ++counts_.pending;
  if (usage_hook_) usage_hook_(key, static_cast<int64_t>(object.size));
  return View(object);
}

absl::StatusOr<ObjectView> IndexShard::Commit(absl::string_view key, uint64_t put_id,
                                              uint64_t checksum, absl::Time now,
                                              absl::string_view caller, absl::Duration lease) {
  absl::MutexLock lock(&mu_);
  last_now_ = std::max(last_now_, now);
  auto it = objects_.find(key);
  if (it == objects_.end() || it->second.put_id != put_id || it->second.owner != caller) {
    return absl::NotFoundError("no such reservation (revoked, expired or another writer's)");
  }
  Object& object = it->second;
  if (!object.committed) {
    object.committed = true;
    object.checksum = checksum;
    if (lease > absl::ZeroDuration()) object.lease_expiry = now + lease;
    pending_.Unlink(&object);
    lru_.PushBack(&object);
    object.last_access = access_clock.fetch_add(1) + 1;
    --counts_.pending;
    ++counts_.committed;
    CountPinLocked(object.pin, +1);
  }
  return View(object);
}

absl::Status IndexShard::Revoke(absl::string_view key, uint64_t put_id,
                               absl::string_view caller) {
  absl::MutexLock lock(&mu_);
  auto it = objects_.find(key);
  if (it == objects_.end() || it->second.put_id != put_id || it->second.owner != caller ||
      it->second.committed) {
    return absl::NotFoundError("no such reservation (committed, expired or another writer's)");
  }
  EraseLocked(it, /*free_space=*/true);
  return absl::OkStatus();
}

IndexShard::Map::iterator IndexShard::FindCommittedLocked(absl::string_view key) {
  auto it = objects_.find(key);
  return it != objects_.end() && it->second.committed ? it : objects_.end();
}

absl::StatusOr<ObjectView> IndexShard::Lookup(absl::string_view key, absl::Time now,
                                              absl::Duration lease) {
  absl::MutexLock lock(&mu_);
  last_now_ = std::max(last_now_, now);
  auto it = FindCommittedLocked(key);
  if (it == objects_.end()) {
    return absl::NotFoundError("object not found");
  }
  Object& object = it->second;
  // What the caller reads, copied once: the live replicas, not the key it asked with (a
  // 2048-key lookup copied each key and each replica list twice, under the shard's lock).
  ObjectView view{.size = object.size,
                  .put_id = object.put_id,
                  .checksum = object.checksum,
                  .pin = object.pin};
  view.replicas.reserve(object.replicas.size());
  for (const Replica& replica : object.replicas) {
    if (Live(replica)) view.replicas.push_back(replica);
  }
  if (view.replicas.empty()) return absl::NotFoundError("object lost with its segments");
  object.lease_expiry = std::max(object.lease_expiry, now + lease);
  view.lease_expiry = object.lease_expiry;
  TouchLocked(object);
  return view;
}

void IndexShard::Touch(absl::string_view key, SegmentId segment) {
  absl::MutexLock lock(&mu_);
  auto it = FindCommittedLocked(key);
  if (it == objects_.end()) return;
  const std::vector<Replica>& replicas = it->second.replicas;
  if (std::any_of(replicas.begin(), replicas.end(),
                  [&](const Replica& r) { return r.segment->id() == segment; })) {
    TouchLocked(it->second);
  }
}

bool IndexShard::Exists(absl::string_view key, absl::Time now, absl::Duration lease) {
  absl::MutexLock lock(&mu_);
  auto it = FindCommittedLocked(key);
  if (it == objects_.end()) return false;
  Object& object = it->second;
  if (std::none_of(object.replicas.begin(), object.replicas.end(), Live)) return false;
  object.lease_expiry = std::max(object.lease_expiry, now + lease);
  TouchLocked(object);
  return true;
}

absl::StatusOr<ObjectView> IndexShard::Remove(absl::string_view key, absl::Time now, bool force) {
  absl::MutexLock lock(&mu_);
  last_now_ = std::max(last_now_, now);
  auto it = FindCommittedLocked(key);
  if (it == objects_.end()) {
    return absl::NotFoundError("object not found");
  }
  if (!force && Migrating(it->second, now)) {
    return ErrorStatus(v1::OBJECT_HAS_LEASE, "object is being copied off a draining segment");
  }
  if (!force && Leased(it->second, now)) {
    return ErrorStatus(v1::OBJECT_HAS_LEASE,
                       absl::StrCat("object is leased by a reader for another ",
                                    absl::FormatDuration(it->second.lease_expiry - now)));
  }
  ObjectView view = View(it->second);
  EraseLocked(it, /*free_space=*/true);
  return view;
}

absl::StatusOr<ObjectView> IndexShard::DropReplica(absl::string_view key,
                                                   absl::string_view segment, absl::Time now,
                                                   bool force) {
  absl::MutexLock lock(&mu_);
  last_now_ = std::max(last_now_, now);
  auto it = FindCommittedLocked(key);
  if (it == objects_.end()) {
    return absl::NotFoundError("object not found");
  }
  Object& object = it->second;
  auto on_segment =
      std::find_if(object.replicas.begin(), object.replicas.end(),
                   [&](const Replica& r) { return r.segment->info().name == segment; });
  if (on_segment == object.replicas.end()) {
    return absl::NotFoundError(absl::StrCat("the object has no replica on segment ", segment));
  }
  // Even forced: a mover may be copying this very replica.
  if (Migrating(object, now)) {
    return ErrorStatus(v1::OBJECT_HAS_LEASE, "object is being copied off a draining segment");
  }
  if (!force && Leased(object, now)) {
    return ErrorStatus(v1::OBJECT_HAS_LEASE,
                       absl::StrCat("object is leased by a reader for another ",
                                    absl::FormatDuration(object.lease_expiry - now)));
  }
  ObjectView view = View(object);
  view.replicas = {*on_segment};
  if (object.replicas.size() == 1) {
    EraseLocked(it, /*free_space=*/true);
    return view;
  }
  ReleaseLocked(*on_segment, object.size, *object.key, GrantsEnd(object),
                TokensLive(object, *on_segment, now));
  on_segment->segment->AddReplicas(-1);
  object.replicas.erase(on_segment);
  return view;
}

std::vector<ObjectView> IndexShard::RemoveAll(absl::Time now, bool force,
                                              const RE2* key_filter) {
  absl::MutexLock lock(&mu_);
  last_now_ = std::max(last_now_, now);
  std::vector<ObjectView> removed;
  for (auto it = objects_.begin(); it != objects_.end();) {
    if (it->second.committed && (force || !Held(it->second, now)) &&
        (key_filter == nullptr || RE2::PartialMatch(it->first, *key_filter))) {
      removed.push_back(View(it->second));
      EraseLocked(it++, /*free_space=*/true);
    } else {
      ++it;
    }
  }
  return removed;
}

Object* IndexShard::OldestEvictableLocked(absl::Time now, bool soft_pinned_too,
                                          size_t scan_limit) const {
  Object* object = lru_.front();
  for (size_t scanned = 0; object != nullptr && scanned < scan_limit; ++scanned) {
    bool pinned = object->pin == PinMode::kHard ||
                  (object->pin == PinMode::kSoft && !soft_pinned_too);
    if (!pinned && !Held(*object, now)) return object;
    object = ObjectList<Object>::Next(object);
  }
  return nullptr;
}

std::optional<uint64_t> IndexShard::OldestEvictable(absl::Time now, bool soft_pinned_too,
                                                    size_t scan_limit) const {
  absl::ReaderMutexLock lock(&mu_);
  Object* object = OldestEvictableLocked(now, soft_pinned_too, scan_limit);
  if (object == nullptr) return std::nullopt;
  return object->last_access;
}

std::optional<ObjectView> IndexShard::EvictOldest(absl::Time now, bool soft_pinned_too,
                                                  size_t scan_limit) {
  absl::MutexLock lock(&mu_);
  last_now_ = std::max(last_now_, now);
  Object* object = OldestEvictableLocked(now, soft_pinned_too, scan_limit);
  if (object == nullptr) return std::nullopt;
  ObjectView view = View(*object);
  EraseLocked(objects_.find(*object->key), /*free_space=*/true);
  return view;
}

uint64_t IndexShard::ReclaimExpired(absl::Time now) {
  absl::MutexLock lock(&mu_);
  last_now_ = std::max(last_now_, now);
  uint64_t reclaimed = 0;
  while (Object* oldest = pending_.front()) {
    if (oldest->put_deadline > now) break;
    EraseLocked(objects_.find(*oldest->key), /*free_space=*/true);
    ++reclaimed;
  }
  std::erase_if(abandoned_, [this, now](const AbandonedCopy& copy) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    if (copy.deadline > now) return false;
    ReleaseLocked(copy.destination, copy.size, "", copy.deadline,
                  copy.deadline + kClockSlack > now);
    copy.destination.segment->AddReplicas(-1);
    return true;
  });
  return reclaimed;
}

uint64_t IndexShard::DropRemovedReplicas() {
  absl::MutexLock lock(&mu_);
  uint64_t erased = 0;
  for (auto it = objects_.begin(); it != objects_.end();) {
    std::optional<Migration>& migration = it->second.migration;
    if (migration && !Live(migration->destination)) {
      migration->destination.segment->AddReplicas(-1);
      migration.reset();
    }
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

uint64_t IndexShard::ReleaseReplicasOn(const MountedSegment& segment, absl::Time now) {
  absl::MutexLock lock(&mu_);
  last_now_ = std::max(last_now_, now);
  uint64_t held = 0;
  for (auto it = objects_.begin(); it != objects_.end();) {
    Object& object = it->second;
    auto on_segment = std::find_if(object.replicas.begin(), object.replicas.end(),
                                   [&](const Replica& r) { return r.segment.get() == &segment; });
    if (on_segment == object.replicas.end()) {
      ++it;
    } else if (!object.committed || Held(object, now)) {
      ++held;
      ++it;
    } else if (object.replicas.size() == 1) {
      EraseLocked(it++, /*free_space=*/true);
    } else {
      ReleaseLocked(*on_segment, object.size, *object.key, GrantsEnd(object),
                    TokensLive(object, *on_segment, now));
      on_segment->segment->AddReplicas(-1);
      object.replicas.erase(on_segment);
      ++it;
    }
  }
  return held;
}

absl::Status IndexShard::Restore(absl::string_view key, uint64_t size, uint64_t checksum,
                                 PinMode pin, const Replica& replica) {
  absl::MutexLock lock(&mu_);
  auto existing = objects_.find(key);
  if (existing != objects_.end()) {
    const Object& object = existing->second;
    bool same = object.committed && object.size == size && object.checksum == checksum;
    bool duplicate = std::any_of(object.replicas.begin(), object.replicas.end(),
                                 [&](const Replica& r) { return r.segment == replica.segment; });
    if (!same || duplicate) {
      return absl::AlreadyExistsError("the index holds a different object under this key");
    }
  }
  if (!replica.segment->allocator().AllocateAt(replica.offset, size)) {
    return absl::AlreadyExistsError("the range overlaps another object of the segment");
  }
  replica.segment->AddReplicas(1);
  if (existing != objects_.end()) {
    existing->second.replicas.push_back(replica);
    return absl::OkStatus();
  }
  auto [it, inserted] = objects_.try_emplace(key);
  Object& object = it->second;
  object.key = &it->first;
  object.size = size;
  object.checksum = checksum;
  object.pin = pin;
  object.committed = true;
  object.replicas.push_back(replica);
  lru_.PushBack(&object);
  object.last_access = access_clock.fetch_add(1) + 1;
  ++counts_.committed;
  CountPinLocked(pin, +1);
  if (usage_hook_) usage_hook_(key, static_cast<int64_t>(size));
  return absl::OkStatus();
}

IndexShard::Counts IndexShard::counts() const {
  absl::ReaderMutexLock lock(&mu_);
  return counts_;
}

uint64_t IndexShard::CountLeased(absl::Time now) const {
  absl::ReaderMutexLock lock(&mu_);
  uint64_t leased = 0;
  for (const Object* object = lru_.front(); object != nullptr;
       object = ObjectList<Object>::Next(object)) {
    leased += Leased(*object, now);
  }
  return leased;
}

void IndexShard::EraseLocked(Map::iterator it, bool free_space) {
  Object& object = it->second;
  AbandonMigrationLocked(object);
  for (const Replica& replica : object.replicas) {
    replica.segment->AddReplicas(-1);
    // Freeing into the allocator of a removed segment is harmless: nobody allocates there.
    if (free_space) {
      ReleaseLocked(replica, object.size, *object.key, GrantsEnd(object),
                    TokensLive(object, replica, last_now_));
    }
  }
  if (object.committed) {
    lru_.Unlink(&object);
    --counts_.committed;
    CountPinLocked(object.pin, -1);
  } else {
    pending_.Unlink(&object);
    --counts_.pending;
  }
  if (usage_hook_) usage_hook_(it->first, -static_cast<int64_t>(object.size));
  objects_.erase(it);
}

void IndexShard::AbandonMigrationLocked(Object& object) {
  if (!object.migration) return;
  abandoned_.push_back({object.migration->destination, object.size, object.migration->deadline});
  object.migration.reset();
}

void IndexShard::StartMigrations(const MountedSegment& from,
                                 absl::Span<const std::shared_ptr<MountedSegment>> targets,
                                 size_t max_objects, uint64_t max_bytes, absl::Time now,
                                 absl::Time deadline, std::atomic<uint64_t>& ids,
                                 MigrationBatch& batch) {
  absl::MutexLock lock(&mu_);
  for (auto& [key, object] : objects_) {
    if (batch.started.size() >= max_objects) batch.full = true;
    if (batch.full) return;
    auto source = ReplicaOn(object.replicas, &from);
    if (source == object.replicas.end()) continue;
    if (!object.committed || Migrating(object, now)) {
      ++batch.in_flight;
      continue;
    }
    AbandonMigrationLocked(object);  // one whose time ran out: start again
    if (object.failed_migrations >= kMaxFailedMigrations) {
      ++batch.unplaceable;
      continue;
    }
    if (!batch.started.empty() && batch.started_bytes + object.size > max_bytes) {
      batch.full = true;
      return;
    }
    std::optional<Replica> destination;
    for (const std::shared_ptr<MountedSegment>& target : targets) {
      if (target.get() == &from || !target->accepts_writes() ||
          ReplicaOn(object.replicas, target.get()) != object.replicas.end()) {
        continue;
      }
      if (std::optional<uint64_t> offset = target->allocator().Allocate(object.size)) {
        target->AddReplicas(1);
        destination = Replica{target, *offset, grant_ids_.Next()};
        break;
      }
    }
    if (!destination) {
      ++batch.unplaceable;
      continue;
    }
    object.migration = Migration{ids.fetch_add(1), &from, *destination, deadline};
    batch.started.push_back({key, object.size, object.checksum, *source, *object.migration});
    batch.started_bytes += object.size;
  }
}

absl::StatusOr<MigrationView> IndexShard::StartCopy(absl::string_view key,
                                                    const CopyRequest& request, absl::Time now) {
  absl::MutexLock lock(&mu_);
  last_now_ = std::max(last_now_, now);
  // Checked in Mooncake's order: the object, then the segments.
  auto it = FindCommittedLocked(key);
  if (it == objects_.end()) {
    return absl::NotFoundError("object not found");
  }
  Object& object = it->second;
  if (request.targets.empty() || request.targets.size() != request.target_names.size()) {
    return ErrorStatus(v1::INVALID_PARAMS, "no target segment given");
  }
  if (request.move && request.targets.size() != 1) {
    return ErrorStatus(v1::INVALID_PARAMS, "a move has exactly one target segment");
  }
  for (size_t i = 0; i < request.targets.size(); ++i) {
    if (request.targets[i] == nullptr) {
      return ErrorStatus(v1::INVALID_PARAMS,
                         absl::StrCat("no segment named ", request.target_names[i]));
    }
  }
  auto source = std::find_if(object.replicas.begin(), object.replicas.end(), Live);
  if (request.move) {
    if (request.source == request.target_names[0]) {
      return ErrorStatus(v1::INVALID_PARAMS, "a move's source and target are the same segment");
    }
    source = std::find_if(object.replicas.begin(), object.replicas.end(), [&](const Replica& r) {
      return Live(r) && r.segment->info().name == request.source;
    });
    if (source == object.replicas.end()) {
      return ErrorStatus(v1::INVALID_PARAMS,
                         absl::StrCat("the object has no replica on segment ", request.source));
    }
  }
  if (source == object.replicas.end()) return absl::NotFoundError("object has no live replica");
  for (size_t i = 0; i < request.targets.size(); ++i) {
    if (!request.targets[i]->accepts_writes()) {
      return ErrorStatus(v1::UNAVAILABLE_IN_CURRENT_STATUS,
                         absl::StrCat("segment ", request.target_names[i],
                                      " takes no new objects (draining or restoring)"));
    }
  }
  if (request.dry_run) return MigrationView{std::string(key), object.size, object.checksum};
  MountedSegment* target = nullptr;
  for (const std::shared_ptr<MountedSegment>& candidate : request.targets) {
    if (ReplicaOn(object.replicas, candidate.get()) == object.replicas.end()) {
      target = candidate.get();
      break;
    }
  }
  if (target == nullptr) {
    return absl::AlreadyExistsError("every target segment holds a replica of the object");
  }
  if (Migrating(object, now)) {
    return ErrorStatus(v1::OBJECT_HAS_LEASE, "another copy of the object is in flight");
  }
  AbandonMigrationLocked(object);  // one whose time ran out
  std::optional<uint64_t> offset = target->allocator().Allocate(object.size);
  if (!offset) {
    return ErrorStatus(v1::NO_AVAILABLE_HANDLE,
                       absl::StrCat("segment ", target->info().name, " has no room for ",
                                    object.size, " bytes"));
  }
  target->AddReplicas(1);
  std::shared_ptr<MountedSegment> held;
  for (const std::shared_ptr<MountedSegment>& candidate : request.targets) {
    if (candidate.get() == target) held = candidate;
  }
  object.migration = Migration{request.id,         source->segment.get(),
                               Replica{held, *offset, grant_ids_.Next()},
                               request.deadline,   /*requested=*/true,
                               /*keep_source=*/!request.move};
  return MigrationView{std::string(key), object.size, object.checksum, *source,
                       *object.migration};
}

absl::StatusOr<FinishedMigration> IndexShard::FinishMigration(absl::string_view key, uint64_t id,
                                                              bool copied, absl::Time now,
                                                              bool requested) {
  absl::MutexLock lock(&mu_);
  last_now_ = std::max(last_now_, now);
  auto it = objects_.find(key);
  if (it == objects_.end() || !it->second.migration || it->second.migration->id != id ||
      it->second.migration->requested != requested) {
    return absl::NotFoundError(
        absl::StrCat("no copy ", id, " of this object in progress (removed, or given back)"));
  }
  Object& object = it->second;
  Migration migration = *object.migration;
  if (!copied || migration.deadline <= now || !Live(migration.destination)) {
    // A drain gives up on an object after repeated failures; a task's copy fails alone.
    if (!migration.requested) ++object.failed_migrations;
    AbandonMigrationLocked(object);
    if (!copied) return FinishedMigration{View(object), migration.destination, std::nullopt};
    return absl::NotFoundError("the copy's tokens expired, or its segment went away");
  }
  object.migration.reset();
  FinishedMigration finished{.destination = migration.destination};
  if (auto source = ReplicaOn(object.replicas, migration.source);
      !migration.keep_source && source != object.replicas.end()) {
    finished.dropped_source = *source;
    ReleaseLocked(*source, object.size, *object.key, GrantsEnd(object),
                  TokensLive(object, *source, now));
    source->segment->AddReplicas(-1);
    object.replicas.erase(source);
  }
  object.replicas.push_back(migration.destination);
  finished.object = View(object);
  return finished;
}

void IndexShard::TouchLocked(Object& object) {
  object.last_access = access_clock.fetch_add(1) + 1;
  lru_.MoveToBack(&object);
}

void IndexShard::CountPinLocked(PinMode pin, int delta) {
  if (pin == PinMode::kSoft) counts_.soft_pinned += delta;
  if (pin == PinMode::kHard) counts_.hard_pinned += delta;
}

}  // namespace kvpool::master
