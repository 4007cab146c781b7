#include "server/master/master.h"

#include <algorithm>
#include <queue>
#include <random>

#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "proto/capability.h"
#include "proto/error_codes.h"
#include "proto/key_read.h"
#include "server/master/tenant_keys.h"

namespace kvpool::master {
namespace {

// Objects eviction looks at from a shard's least recently used end before giving up on it
// (all leased or pinned).
constexpr size_t kEvictionScanLimit = 512;

uint64_t RandomSeed() {
  std::random_device device;
  return (static_cast<uint64_t>(device()) << 32) ^ device();
}

}  // namespace

Master::Master(MasterOptions options)
    : options_(std::move(options)),
      next_put_id_(RandomSeed() | 1),
      tenant_usage_(options_.tenant_quotas) {
  // Per-tenant bytes are counted only where quotas are set: the count is one more lock per
  // reservation and erase, shared by every shard.
  for (IndexShard& shard : shards_) {
    if (options_.tenant_quotas.empty()) break;
    shard.SetUsageHook([this](absl::string_view key, int64_t delta) {
      tenant_usage_.Add(TenantOfKey(key), delta);
    });
  }
  // A range whose grant ended is freed only once its segment has applied the end (a FORGET
  // record): until then a late writer of the old grant could still land bytes in it.
  for (IndexShard& shard : shards_) {
    shard.SetReleaser([this](const Replica& replica, uint64_t size, const std::string& key,
                             absl::Time until, bool tokens_live) {
      ManifestRecord forget{.kind = ManifestRecord::Kind::kForget,
                            .key = key,
                            .offset = replica.offset,
                            .size = size,
                            .grant = replica.grant,
                            .until = until};
      if (!tokens_live) {
        // No token of the grant can be honoured any more (lease over, writes fenced or
        // expired): the range can be reused at once; the FORGET is for the manifest.
        manifest_sync_.Append(replica.segment->id(), std::move(forget), nullptr);
        replica.segment->allocator().Free(replica.offset, size);
        return;
      }
      manifest_sync_.AppendThen(
          replica.segment->id(), std::move(forget), /*ticket=*/nullptr,
          [segment = replica.segment, offset = replica.offset, size] {
            segment->allocator().Free(offset, size);
          });
    });
  }
}

IndexShard& Master::ShardFor(absl::string_view key) {
  // Not by the hash the shard's own table uses: the keys of one shard would share its low
  // bits, and the table tells keys apart by its low 7 bits before comparing them (with 64
  // shards a lookup compared about half of a probed group's keys).
  return shards_[absl::HashOf(key, kShardSalt) % kNumShards];
}

absl::Status Master::ValidateKey(absl::string_view key) const {
  if (key.empty()) return ErrorStatus(v1::INVALID_KEY, "key is empty");
  if (key.size() > options_.max_key_bytes) {
    return ErrorStatus(v1::INVALID_KEY, absl::StrCat("key is ", key.size(), " bytes, longer than ",
                                                     options_.max_key_bytes));
  }
  return absl::OkStatus();
}

PlacementView Master::MakePlacement(const Replica& replica, uint64_t size, wire::Opcode opcode,
                                    absl::Time expiry, bool mint) const {
  const SegmentInfo& info = replica.segment->info();
  PlacementView placement;
  placement.segment_name = info.name;
  placement.host = info.host;
  placement.endpoint = info.endpoint;
  placement.incarnation = info.incarnation;
  placement.offset = replica.offset;
  placement.length = size;
  if (mint) {
    placement.token = wire::MintToken(replica.segment->token_key(), opcode, replica.offset, size,
                                      expiry, replica.grant);
  }
  return placement;
}

// --- Segments ---

absl::Status Master::MountSegment(SegmentInfo info) {
  std::string name = info.name;
  absl::StatusOr<SegmentRegistry::MountResult> mounted =
      segments_.Mount(std::move(info), options_.clock());
  if (!mounted.ok()) return mounted.status();
  if (mounted->replaced) {
    KVPOOL_LOG(WARNING) << "segment " << name
                        << " restarted or mounted afresh; dropping the replicas it held (it "
                           "reports the committed ones again)";
    manifest_sync_.Untrack(*mounted->replaced);
    DropRemovedReplicas();
  }
  if (!mounted->already_mounted) {
    const MountedSegment& segment = *mounted->segment;
    if (!segment.info().embedded) {
      manifest_sync_.Track(segment.id());
    } else {
      // The record's range is freed right after this (AppendThen): a late shared-memory
      // write it leaves busy is held first, as a heartbeat's report would be.
      std::weak_ptr<MountedSegment> weak = mounted->segment;
      manifest_sync_.TrackLocal(
          segment.id(), [apply = segment.info().apply_record, busy = segment.info().busy_ranges,
                         weak](const ManifestRecord& record) {
            if (!apply) return;  // nothing to tell (e.g. a test's embedded segment)
            apply(record);
            if (std::shared_ptr<MountedSegment> held = weak.lock(); held && busy) {
              held->ReportBusy(busy()).IgnoreError();  // its own, within bounds
            }
          });
    }
    KVPOOL_LOG(INFO) << "mounted segment " << name << " (" << segment.allocator().capacity()
                     << " bytes at " << segment.info().endpoint << ")"
                     << (segment.restoring() ? ", restoring its manifest" : "");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> Master::RestoreManifest(
    const std::string& name, uint64_t incarnation, absl::Span<const ManifestRecord> records) {
  std::shared_ptr<MountedSegment> segment = segments_.Find(name, incarnation);
  if (segment == nullptr) {
    return absl::NotFoundError(absl::StrCat("segment ", name, " is not mounted"));
  }
  std::vector<std::string> refused;
  const uint64_t capacity = segment->allocator().capacity();
  for (const ManifestRecord& record : records) {
    // What a segment reports is checked like anything else from a socket: a sane size, a
    // range inside its pool, a valid key.
    bool sane = record.kind == ManifestRecord::Kind::kAdd && record.size > 0 &&
                record.size <= capacity && record.offset <= capacity - record.size &&
                record.offset % RangeAllocator::kAlignment == 0 && ValidateKey(record.key).ok();
    absl::Status restored =
        sane ? ShardFor(record.key).Restore(record.key, record.size, record.checksum, record.pin,
                                            Replica{segment, record.offset, grant_ids_.Next()})
             : absl::InvalidArgumentError("bad manifest record");
    if (!restored.ok()) {
      if (!sane) {
        KVPOOL_LOG(WARNING) << "segment " << name << " reported a bad manifest record (key of "
                            << record.key.size() << " bytes, [" << record.offset << ", +"
                            << record.size << ") in a pool of " << capacity << "); refused";
      }
      refused.push_back(record.key);
    }
  }
  return refused;
}

absl::Status Master::FinishRestore(const std::string& name, uint64_t incarnation) {
  std::shared_ptr<MountedSegment> segment = segments_.Find(name, incarnation);
  if (segment == nullptr) {
    return absl::NotFoundError(absl::StrCat("segment ", name, " is not mounted"));
  }
  if (segment->restoring()) {
    segment->FinishRestoring();
    KVPOOL_LOG(INFO) << "segment " << name << " restored " << segment->replica_count()
                     << " objects from its manifest";
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> Master::UnmountSegment(const std::string& name, uint64_t incarnation) {
  absl::StatusOr<SegmentId> removed = segments_.Unmount(name, incarnation);
  if (!removed.ok()) return removed.status();
  manifest_sync_.Untrack(*removed);
  uint64_t dropped = DropRemovedReplicas();
  KVPOOL_LOG(INFO) << "unmounted segment " << name << "; " << dropped
                   << " objects lost their last replica";
  return dropped;
}

Master::HeartbeatReply Master::Heartbeat(const std::string& name, uint64_t incarnation) {
  HeartbeatReply reply;
  reply.segment = segments_.Heartbeat(name, incarnation, options_.clock());
  reply.known = reply.segment.has_value();
  reply.drained = !reply.known && segments_.WasDrained(name, incarnation);
  return reply;
}

absl::Status Master::ReportBusyRanges(SegmentId id, absl::Span<const wire::ByteRange> busy) {
  std::shared_ptr<MountedSegment> segment = segments_.Get(id);
  if (segment == nullptr) return absl::NotFoundError("the segment is no longer mounted");
  return segment->ReportBusy(busy);
}

void Master::RefreshEmbeddedBusy() {
  for (const std::shared_ptr<MountedSegment>& segment : segments_.List()) {
    if (segment->info().embedded && segment->info().busy_ranges) {
      segment->ReportBusy(segment->info().busy_ranges()).IgnoreError();
    }
    if (segment->info().embedded && segment->info().keys_read) {
      TouchKeys(segment->id(), segment->info().keys_read());
    }
  }
}

void Master::TouchKeys(SegmentId segment, absl::Span<const std::string> stored_keys) {
  for (const std::string& key : stored_keys) ShardFor(key).Touch(key, segment);
}

absl::Status Master::DrainSegment(const std::string& name, bool migrate) {
  std::shared_ptr<MountedSegment> segment = segments_.FindByName(name);
  if (segment == nullptr) {
    return ErrorStatus(v1::SEGMENT_NOT_FOUND, absl::StrCat("no segment named ", name));
  }
  // Set before draining starts, so that FinishDrains never sees the segment draining without
  // its mover and drops what the mover is about to copy.
  if (migrate) segment->SetMoverDeadline(options_.clock() + options_.put_timeout);
  if (!segment->draining()) {
    segment->MarkDraining();
    KVPOOL_LOG(INFO) << "draining segment " << name << ": no new objects go there"
                     << (migrate ? "; its objects are being copied elsewhere" : "");
  }
  return absl::OkStatus();
}

absl::StatusOr<MigrateStartResult> Master::MigrateStart(const std::string& name,
                                                        size_t max_objects, uint64_t max_bytes) {
  std::shared_ptr<MountedSegment> segment = segments_.FindByName(name);
  if (segment == nullptr) {
    return ErrorStatus(v1::SEGMENT_NOT_FOUND, absl::StrCat("no segment named ", name));
  }
  if (!segment->draining()) {
    return absl::FailedPreconditionError(
        absl::StrCat("segment ", name, " is not draining: drain it first"));
  }
  absl::Time now = options_.clock();
  absl::Time deadline = now + options_.put_timeout;
  segment->SetMoverDeadline(deadline);
  // Targets with the most free space first.
  std::vector<std::shared_ptr<MountedSegment>> targets = segments_.List();
  std::erase_if(targets, [](const auto& target) { return !target->accepts_writes(); });
  std::stable_sort(targets.begin(), targets.end(), [](const auto& a, const auto& b) {
    return a->allocator().capacity() - a->allocator().used() >
           b->allocator().capacity() - b->allocator().used();
  });
  MigrationBatch batch;
  for (IndexShard& shard : shards_) {
    shard.StartMigrations(*segment, targets, std::max<size_t>(max_objects, 1), max_bytes, now,
                          deadline, next_put_id_, batch);
    if (batch.full) break;
  }
  MigrateStartResult result{.in_flight = batch.in_flight, .unplaceable = batch.unplaceable};
  for (const MigrationView& started : batch.started) {
    result.migrations.push_back(MigrationPlan{
        .key = started.key,
        .id = started.migration.id,
        .size = started.size,
        .checksum = started.checksum,
        .source = MakePlacement(started.source, started.size, wire::Opcode::kRead, deadline),
        .destination = MakePlacement(started.migration.destination, started.size,
                                     wire::Opcode::kWrite, deadline)});
  }
  if (result.migrations.empty() && result.in_flight == 0) {
    segment->SetMoverDeadline(now);  // done: what is left cannot move
    KVPOOL_LOG(INFO) << "segment " << name << ": every object that could move has moved ("
                     << result.unplaceable << " could not)";
  }
  return result;
}

absl::StatusOr<MigrationPlan> Master::ReplicaCopyStart(const std::string& key,
                                                       absl::Span<const std::string> targets,
                                                       const std::string& source, bool move,
                                                       bool dry_run) {
  if (absl::Status valid = ValidateKey(key); !valid.ok()) return valid;
  absl::Time now = options_.clock();
  CopyRequest request;
  for (const std::string& name : targets) {
    request.targets.push_back(segments_.FindByName(name));
    request.target_names.push_back(name);
  }
  request.source = source;
  request.move = move;
  request.dry_run = dry_run;
  // Random, so that nobody ends another caller's copy by guessing its id.
  request.id = grant_ids_.Next();
  request.deadline = now + options_.put_timeout;
  absl::StatusOr<MigrationView> started = ShardFor(key).StartCopy(key, request, now);
  if (!started.ok()) return started.status();
  MigrationPlan plan{.key = key, .size = started->size, .checksum = started->checksum};
  if (dry_run) return plan;
  plan.id = started->migration.id;
  plan.source = MakePlacement(started->source, started->size, wire::Opcode::kRead,
                              request.deadline);
  plan.destination = MakePlacement(started->migration.destination, started->size,
                                   wire::Opcode::kWrite, request.deadline);
  return plan;
}

Durable<absl::Status> Master::MigrateEnd(absl::Span<const MigrationRef> refs) {
  return FinishCopies(refs, /*requested=*/false);
}

Durable<absl::Status> Master::ReplicaCopyEnd(absl::Span<const MigrationRef> refs) {
  return FinishCopies(refs, /*requested=*/true);
}

Durable<absl::Status> Master::FinishCopies(absl::Span<const MigrationRef> refs, bool requested) {
  ManifestSync::DeferredPolls polls;  // answered once the batch's records are all queued
  Durable<absl::Status> durable;
  absl::Time now = options_.clock();
  for (const MigrationRef& ref : refs) {
    absl::Status valid = ValidateKey(ref.key);
    if (!valid.ok()) {
      durable.results.push_back(valid);
      continue;
    }
    absl::StatusOr<FinishedMigration> finished =
        ShardFor(ref.key).FinishMigration(ref.key, ref.id, ref.copied, now, requested);
    durable.results.push_back(finished.status());
    if (!finished.ok() || !ref.copied) continue;
    const ObjectView& object = finished->object;
    manifest_sync_.Append(finished->destination.segment->id(),
                          ManifestRecord{ManifestRecord::Kind::kAdd, ref.key,
                                         finished->destination.offset, object.size,
                                         object.checksum, object.pin,
                                         finished->destination.grant, now + options_.put_timeout},
                          &durable.ticket, &polls);
    if (const std::optional<Replica>& source = finished->dropped_source) {
      // The shard's releaser queued its FORGET; wait for it too.
      manifest_sync_.Barrier(source->segment->id(), &durable.ticket);
      if (source->segment->mover_active(now)) {
        source->segment->SetMoverDeadline(now + options_.put_timeout);
      }
    }
  }
  return durable;
}

size_t Master::ExpireSegments() {
  std::vector<std::shared_ptr<MountedSegment>> expired =
      segments_.RemoveExpired(options_.clock(), options_.segment_ttl);
  for (const auto& segment : expired) {
    KVPOOL_LOG(WARNING) << "segment " << segment->info().name << " missed heartbeats for "
                        << options_.segment_ttl << "; declared dead";
    manifest_sync_.Untrack(segment->id());
  }
  if (!expired.empty()) {
    counters_.segments_expired.fetch_add(expired.size());
    DropRemovedReplicas();
  }
  return expired.size();
}

size_t Master::FinishDrains() {
  size_t finished = 0;
  absl::Time now = options_.clock();
  for (const std::shared_ptr<MountedSegment>& segment : segments_.List()) {
    if (!segment->draining() || segment->mover_active(now)) continue;
    uint64_t held = 0;
    for (IndexShard& shard : shards_) held += shard.ReleaseReplicasOn(*segment, now);
    if (held > 0) continue;  // leased or being written: wait for the next round
    const SegmentInfo& info = segment->info();
    if (segments_.Unmount(info.name, info.incarnation, /*drained=*/true).ok()) {
      manifest_sync_.Untrack(segment->id());
      DropRemovedReplicas();
      KVPOOL_LOG(INFO) << "segment " << info.name << " drained and unmounted";
      ++finished;
    }
  }
  return finished;
}

uint64_t Master::DropRemovedReplicas() {
  uint64_t dropped = 0;
  for (IndexShard& shard : shards_) dropped += shard.DropRemovedReplicas();
  return dropped;
}

// --- Objects ---

absl::StatusOr<std::vector<PutStartResult>> Master::BatchPutStart(
    absl::Span<const std::string> keys, absl::Span<const uint64_t> sizes,
    const PutStartOptions& options) {
  if (keys.size() != sizes.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(keys.size(), " keys but ", sizes.size(), " sizes"));
  }
  absl::Time now = options_.clock();
  ReserveRequest request;
  request.replica_num = std::max<uint32_t>(options.replica_num, 1);
  request.pin = options.pin;
  request.owner = options.owner;
  request.put_deadline = now + options_.put_timeout;

  // Free space per segment, estimated once per batch and kept up to date as keys land, so
  // that the keys of one batch spread over the segments.
  struct Candidate {
    std::shared_ptr<MountedSegment> segment;
    // Position in options.preferred_segments (named ones first, in that order); then those
    // of the preferred host or machine; then the others.
    size_t named = SIZE_MAX;
    bool preferred = false;
    uint64_t free = 0;
  };
  std::vector<Candidate> candidates;
  uint64_t largest = 0;
  auto refresh = [&] {
    candidates.clear();
    largest = 0;
    for (std::shared_ptr<MountedSegment>& segment : segments_.List()) {
      if (!segment->accepts_writes()) continue;
      const RangeAllocator& allocator = segment->allocator();
      largest = std::max(largest, allocator.capacity());
      const SegmentInfo& info = segment->info();
      bool preferred =
          (!options.preferred_host.empty() && info.host == options.preferred_host) ||
          (!options.preferred_machine_id.empty() && info.machine_id == options.preferred_machine_id);
      auto named = std::find(options.preferred_segments.begin(),
                             options.preferred_segments.end(), info.name);
      candidates.push_back({std::move(segment),
                            named == options.preferred_segments.end()
                                ? SIZE_MAX
                                : static_cast<size_t>(named - options.preferred_segments.begin()),
                            preferred, allocator.capacity() - allocator.used()});
    }
  };
  refresh();
  auto reserve = [&](const std::string& key) {
    std::stable_sort(candidates.begin(), candidates.end(), [](const auto& a, const auto& b) {
      if (a.named != b.named) return a.named < b.named;
      return a.preferred != b.preferred ? a.preferred : a.free > b.free;
    });
    // The key's home segment (proto/key_read.h), where readers look first, goes first among
    // those tried first, if it has room.
    auto home = candidates.end();
    double best = 0;
    for (auto it = candidates.begin(); it != candidates.end(); ++it) {
      double score =
          wire::HomeScore(key, it->segment->info().name, it->segment->allocator().capacity());
      if (home == candidates.end() || score > best) home = it, best = score;
    }
    if (home != candidates.end() && home->named == candidates.front().named &&
        home->preferred == candidates.front().preferred &&
        home->free >= RangeAllocator::Rounded(request.size)) {
      std::rotate(candidates.begin(), home, home + 1);
    }
    std::vector<std::shared_ptr<MountedSegment>> order;
    for (const Candidate& candidate : candidates) order.push_back(candidate.segment);
    absl::StatusOr<ObjectView> reserved = ShardFor(key).Reserve(key, request, order);
    if (reserved.ok()) {
      for (const Replica& replica : reserved->replicas) {
        for (Candidate& candidate : candidates) {
          if (candidate.segment == replica.segment) {
            candidate.free -= std::min(candidate.free, RangeAllocator::Rounded(request.size));
          }
        }
      }
    }
    return reserved;
  };

  std::vector<PutStartResult> results(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    PutStartResult& result = results[i];
    result.status = ValidateKey(keys[i]);
    if (!result.status.ok()) continue;
    if (sizes[i] == 0) {
      result.status = ErrorStatus(v1::INVALID_PARAMS, "size is 0");
      continue;
    }
    if (candidates.empty()) {
      result.status = ErrorStatus(v1::NO_AVAILABLE_HANDLE, "no segment takes new objects");
      continue;
    }
    if (sizes[i] > largest) {
      result.status = ErrorStatus(
          v1::INVALID_PARAMS, absl::StrCat("size ", sizes[i], " is larger than any segment (",
                                           largest, " bytes)"));
      continue;
    }
    // A tenant at its byte quota is under pressure, whatever room the pool has.
    result.status = tenant_usage_.CheckRoom(TenantOfKey(keys[i]), sizes[i]);
    if (!result.status.ok()) continue;
    request.size = sizes[i];
    // Unpredictable (CSPRNG), so nobody can commit or revoke another client's reservation by
    // guessing its id.
    request.put_id = grant_ids_.Next();
    // Step P1: reserve space on distinct segments, evicting once if there is none.
    absl::StatusOr<ObjectView> reserved = reserve(keys[i]);
    if (reserved.status().code() == absl::StatusCode::kResourceExhausted) {
      uint64_t capacity = 0;
      for (const Candidate& candidate : candidates) capacity += candidate.segment->allocator().capacity();
      uint64_t wanted = std::max<uint64_t>(
          RangeAllocator::Rounded(sizes[i]) * request.replica_num,
          static_cast<uint64_t>(options_.eviction_ratio * static_cast<double>(capacity)));
      // Unpinned objects first; soft-pinned ones only when nothing else makes room.
      for (bool soft_pinned_too : {false, true}) {
        if (reserved.ok() || Evict(wanted, soft_pinned_too) == 0) continue;
        refresh();
        reserved = reserve(keys[i]);
      }
    }
    if (!reserved.ok()) {
      result.status = reserved.status().code() == absl::StatusCode::kResourceExhausted
                          ? ErrorStatus(v1::NO_AVAILABLE_HANDLE, reserved.status().message())
                          : reserved.status();
      continue;
    }
    result.put_id = request.put_id;
    result.deadline = request.put_deadline;
    for (const Replica& replica : reserved->replicas) {
      result.placements.push_back(
          MakePlacement(replica, sizes[i], wire::Opcode::kWrite, request.put_deadline));
    }
  }
  return results;
}

Durable<absl::Status> Master::BatchPutEnd(absl::Span<const PutRef> puts) {
  // The segments hear of the batch's records once they are all queued.
  ManifestSync::DeferredPolls polls;
  Durable<absl::Status> durable;
  durable.results.reserve(puts.size());
  absl::Time now = options_.clock();
  for (size_t index = 0; index < puts.size(); ++index) {
    const PutRef& put = puts[index];
    absl::Status valid = ValidateKey(put.key);
    if (!valid.ok()) {
      durable.results.push_back(valid);
      continue;
    }
    // Step P3: the object becomes visible, and goes into its segments' manifests.
    absl::StatusOr<ObjectView> committed =
        ShardFor(put.key).Commit(put.key, put.put_id, put.checksum, now, put.caller,
                                 options_.lease_on_put ? options_.lease_ttl : absl::ZeroDuration());
    durable.results.push_back(committed.status());
    if (!committed.ok()) continue;
    // The ADD also ends the replica's write grant at the segment: a write after the commit
    // is refused. No write token outlives now + put_timeout.
    // Once applied, the replica's range can be reused at once when the object goes (no
    // write token of it is honoured any more).
    for (const Replica& replica : committed->replicas) {
      manifest_sync_.AppendThen(
          replica.segment->id(),
          ManifestRecord{ManifestRecord::Kind::kAdd, put.key, replica.offset, committed->size,
                         committed->checksum, committed->pin, replica.grant,
                         now + options_.put_timeout},
          &durable.ticket,
          [this, key = put.key, grant = replica.grant] {
            ShardFor(key).MarkWritesFenced(key, grant);
          },
          // The segment found other bytes in the range than those of the checksum (never, or
          // wrongly, written): the commit fails and the object goes; the FORGET that frees the
          // range also ends the grant for reads.
          [this, key = put.key, grant = replica.grant, index, refusals = durable.refusals,
           segment = replica.segment->info().name] {
            if (!ShardFor(key).DropRefused(key, grant)) return;
            counters_.commits_refused.fetch_add(1, std::memory_order_relaxed);
            uint64_t suppressed = 0;
            if (refusal_log_.Allow(&suppressed)) {
              KVPOOL_LOG(WARNING) << "segment " << segment << " refused the commit of " << key
                                  << ": its range does not hold the bytes of the checksum"
                                  << SuppressedNote(suppressed);
            }
            absl::MutexLock lock(&refusals->mu);
            refusals->by_index[index] = ErrorStatus(
                v1::CHECKSUM_MISMATCH,
                absl::StrCat("segment ", segment,
                             " refused the commit: the bytes in the reserved range do not match "
                             "the checksum given (never, partly or wrongly written); nothing was "
                             "committed, put again"));
          },
          &polls);
    }
  }
  return durable;
}

std::vector<absl::Status> Master::BatchPutRevoke(absl::Span<const PutRef> puts) {
  std::vector<absl::Status> results;
  results.reserve(puts.size());
  for (const PutRef& put : puts) {
    absl::Status valid = ValidateKey(put.key);
    results.push_back(valid.ok() ? ShardFor(put.key).Revoke(put.key, put.put_id, put.caller)
                                 : valid);
  }
  return results;
}

std::vector<GetResult> Master::BatchGetReplicaList(absl::Span<const std::string> keys,
                                                   ReadTokens tokens) {
  absl::Time now = options_.clock();
  std::vector<GetResult> results(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    GetResult& result = results[i];
    result.status = ValidateKey(keys[i]);
    if (!result.status.ok()) continue;
    // Step G1: committed replicas under a lease, with read tokens that expire with it.
    absl::StatusOr<ObjectView> object = ShardFor(keys[i]).Lookup(keys[i], now, options_.lease_ttl);
    if (!object.ok()) {
      result.status = object.status();
      continue;
    }
    result.size = object->size;
    result.checksum = object->checksum;
    result.lease_expiry = object->lease_expiry;
    for (const Replica& replica : object->replicas) {
      result.replicas.push_back(MakePlacement(replica, object->size, wire::Opcode::kRead,
                                              object->lease_expiry,
                                              tokens == ReadTokens::kMinted));
    }
  }
  return results;
}

std::vector<absl::StatusOr<bool>> Master::BatchExist(absl::Span<const std::string> keys) {
  absl::Time now = options_.clock();
  std::vector<absl::StatusOr<bool>> results;
  results.reserve(keys.size());
  for (const std::string& key : keys) {
    absl::Status valid = ValidateKey(key);
    if (!valid.ok()) {
      results.push_back(valid);
      continue;
    }
    results.push_back(ShardFor(key).Exists(key, now, options_.lease_ttl));
  }
  return results;
}

void Master::ForgetOnSegments(absl::Span<const ObjectView> removed, ManifestSync::Ticket* ticket) {
  // The shard's releaser queued the FORGET records when it erased the objects.
  if (ticket == nullptr) return;
  for (const ObjectView& object : removed) {
    for (const Replica& replica : object.replicas) {
      manifest_sync_.Barrier(replica.segment->id(), ticket);
    }
  }
}

Durable<absl::Status> Master::BatchRemove(absl::Span<const std::string> keys, bool force) {
  Durable<absl::Status> durable;
  durable.results.reserve(keys.size());
  absl::Time now = options_.clock();
  for (const std::string& key : keys) {
    absl::Status valid = ValidateKey(key);
    if (!valid.ok()) {
      durable.results.push_back(valid);
      continue;
    }
    absl::StatusOr<ObjectView> removed = ShardFor(key).Remove(key, now, force);
    if (removed.ok()) {
      ManifestSync::Ticket own;
      ForgetOnSegments(absl::MakeConstSpan(&*removed, 1), &own);
      durable.ticket.waits.insert(durable.ticket.waits.end(), own.waits.begin(), own.waits.end());
      if (!own.empty()) {
        absl::MutexLock lock(&removals_mu_);
        if (unsettled_removals_.size() < kMaxUnsettledRemovals ||
            unsettled_removals_.contains(key)) {
          unsettled_removals_[key] = UnsettledRemoval{std::move(own), now};
        }
      }
      durable.results.push_back(absl::OkStatus());
      continue;
    }
    if (removed.status().code() == absl::StatusCode::kNotFound) {
      // A retry of a removal answered as not durable: the same answer as the removal, once
      // what it waits for is applied (at once if it already is).
      absl::MutexLock lock(&removals_mu_);
      if (auto it = unsettled_removals_.find(key); it != unsettled_removals_.end()) {
        const auto& waits = it->second.ticket.waits;
        durable.ticket.waits.insert(durable.ticket.waits.end(), waits.begin(), waits.end());
        durable.results.push_back(absl::OkStatus());
        continue;
      }
    }
    durable.results.push_back(removed.status());
  }
  return durable;
}

void Master::SettleRemovals(absl::Span<const std::string> keys) {
  absl::MutexLock lock(&removals_mu_);
  for (const std::string& key : keys) {
    auto it = unsettled_removals_.find(key);
    if (it != unsettled_removals_.end() && manifest_sync_.Applied(it->second.ticket)) {
      unsettled_removals_.erase(it);
    }
  }
}

size_t Master::ForgetSettledRemovals() {
  absl::Time now = options_.clock();
  absl::MutexLock lock(&removals_mu_);
  absl::erase_if(unsettled_removals_, [&](const auto& entry) {
    return now - entry.second.removed >= kRemovalRetryWindow &&
           manifest_sync_.Applied(entry.second.ticket);
  });
  return unsettled_removals_.size();
}

Durable<absl::Status> Master::BatchDropReplicas(absl::Span<const std::string> keys,
                                                const std::string& segment, bool force) {
  Durable<absl::Status> durable;
  durable.results.reserve(keys.size());
  absl::Time now = options_.clock();
  for (const std::string& key : keys) {
    absl::Status valid = ValidateKey(key);
    if (valid.ok() && segment.empty()) {
      valid = absl::InvalidArgumentError("BatchDropReplicas needs a segment name");
    }
    if (!valid.ok()) {
      durable.results.push_back(valid);
      continue;
    }
    absl::StatusOr<ObjectView> dropped = ShardFor(key).DropReplica(key, segment, now, force);
    durable.results.push_back(dropped.status());
    if (dropped.ok()) ForgetOnSegments(absl::MakeConstSpan(&*dropped, 1), &durable.ticket);
  }
  return durable;
}

Durable<uint64_t> Master::RemoveAll(bool force, const RE2* key_filter) {
  Durable<uint64_t> durable;
  absl::Time now = options_.clock();
  uint64_t removed = 0;
  for (IndexShard& shard : shards_) {
    std::vector<ObjectView> objects = shard.RemoveAll(now, force, key_filter);
    removed += objects.size();
    ForgetOnSegments(objects, &durable.ticket);
  }
  durable.results.push_back(removed);
  return durable;
}

// --- Eviction and reclaim ---

uint64_t Master::Evict(uint64_t bytes, bool soft_pinned_too) {
  absl::Time now = options_.clock();
  // Every shard keeps its objects in access order, so the globally least recently used
  // evictable object is the oldest of the shards' oldest: merge them with a heap.
  using Head = std::pair<uint64_t, size_t>;  // (last access, shard)
  std::priority_queue<Head, std::vector<Head>, std::greater<Head>> heads;
  auto peek = [&](size_t shard) {
    if (std::optional<uint64_t> oldest =
            shards_[shard].OldestEvictable(now, soft_pinned_too, kEvictionScanLimit)) {
      heads.emplace(*oldest, shard);
    }
  };
  for (size_t shard = 0; shard < kNumShards; ++shard) peek(shard);
  uint64_t freed = 0;
  uint64_t objects = 0;
  while (freed < bytes && !heads.empty()) {
    size_t shard = heads.top().second;
    heads.pop();
    if (std::optional<ObjectView> evicted =
            shards_[shard].EvictOldest(now, soft_pinned_too, kEvictionScanLimit)) {
      freed += RangeAllocator::Rounded(evicted->size) * evicted->replicas.size();
      ++objects;
      ForgetOnSegments(absl::MakeConstSpan(&*evicted, 1), nullptr);
    }
    peek(shard);
  }
  if (objects > 0) {
    counters_.evicted_objects.fetch_add(objects);
    counters_.evicted_bytes.fetch_add(freed);
    KVPOOL_LOG(DEBUG) << "evicted " << objects << " objects (" << freed << " bytes)";
  }
  return freed;
}

uint64_t Master::EvictIfAboveHighWatermark() {
  ClusterSummary summary = GetClusterSummary();
  double capacity = static_cast<double>(summary.capacity_bytes);
  if (capacity == 0 ||
      static_cast<double>(summary.used_bytes) <= options_.eviction_high_watermark * capacity) {
    return 0;
  }
  // Soft-pinned objects are left alone here: they go only when an allocation fails.
  return Evict(static_cast<uint64_t>(options_.eviction_ratio * capacity), false);
}

uint64_t Master::ReclaimExpiredReservations() {
  absl::Time now = options_.clock();
  uint64_t reclaimed = 0;
  for (IndexShard& shard : shards_) reclaimed += shard.ReclaimExpired(now);
  if (reclaimed > 0) {
    counters_.reclaimed_reservations.fetch_add(reclaimed);
    KVPOOL_LOG(INFO) << "reclaimed " << reclaimed
                     << " reservations whose writers never committed within "
                     << options_.put_timeout;
  }
  return reclaimed;
}

// --- Status ---

SegmentSummary Master::Summarize(const MountedSegment& segment, absl::Time now) const {
  SegmentSummary s;
  s.name = segment.info().name;
  s.host = segment.info().host;
  s.endpoint = segment.info().endpoint;
  s.shm_socket = segment.info().shm_socket;
  s.machine_id = segment.info().machine_id;
  s.capacity_bytes = segment.allocator().capacity();
  s.used_bytes = segment.allocator().used();
  s.busy_bytes = segment.allocator().held();
  s.replicas = segment.replica_count();
  s.embedded = segment.info().embedded;
  s.draining = segment.draining();
  s.restoring = segment.restoring();
  s.heartbeat_age = s.embedded ? absl::ZeroDuration() : now - segment.last_heartbeat();
  return s;
}

std::vector<SegmentSummary> Master::ListSegments(std::optional<absl::string_view> tenant) const {
  absl::Time now = options_.clock();
  std::vector<SegmentSummary> listed;
  for (const auto& segment : segments_.List()) {
    SegmentSummary& s = listed.emplace_back(Summarize(*segment, now));
    if (tenant.has_value()) {
      s.key_read_expiry = now + kKeyReadCredentialTtl;
      s.key_read_credential =
          wire::MintKeyReadCredential(segment->token_key(), *tenant, s.key_read_expiry);
    }
  }
  return listed;
}

ClusterSummary Master::GetClusterSummary() const {
  ClusterSummary summary;
  absl::Time now = options_.clock();
  for (const auto& segment : segments_.List()) {
    SegmentSummary s = Summarize(*segment, now);
    summary.capacity_bytes += s.capacity_bytes;
    summary.used_bytes += s.used_bytes;
    summary.segments.push_back(std::move(s));
  }
  for (const IndexShard& shard : shards_) {
    IndexShard::Counts counts = shard.counts();
    summary.objects += counts.committed;
    summary.pending_objects += counts.pending;
    summary.soft_pinned += counts.soft_pinned;
    summary.hard_pinned += counts.hard_pinned;
  }
  return summary;
}

uint64_t Master::CountLeased() const {
  absl::Time now = options_.clock();
  uint64_t leased = 0;
  for (const IndexShard& shard : shards_) leased += shard.CountLeased(now);
  return leased;
}

}  // namespace kvpool::master
