#include "server/master/master.h"

#include <random>

#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "proto/capability.h"
#include "proto/error_codes.h"

namespace kvpool::master {
namespace {

uint64_t RandomSeed() {
  std::random_device device;
  return (static_cast<uint64_t>(device()) << 32) ^ device();
}

}  // namespace

Master::Master(MasterOptions options)
    : options_(std::move(options)), next_put_id_(RandomSeed() | 1) {}

IndexShard& Master::ShardFor(absl::string_view key) {
  return shards_[absl::HashOf(key) % kNumShards];
}

const IndexShard& Master::ShardFor(absl::string_view key) const {
  return shards_[absl::HashOf(key) % kNumShards];
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
                                    absl::Time expiry) const {
  const SegmentInfo& info = replica.segment->info();
  PlacementView placement;
  placement.segment_name = info.name;
  placement.host = info.host;
  placement.endpoint = info.endpoint;
  placement.offset = replica.offset;
  placement.length = size;
  placement.token = wire::MintToken(info.token_secret, opcode, replica.offset, size, expiry);
  return placement;
}

absl::Status Master::MountSegment(SegmentInfo info) {
  std::string name = info.name;
  absl::StatusOr<SegmentRegistry::MountResult> mounted =
      segments_.Mount(std::move(info), options_.clock());
  if (!mounted.ok()) return mounted.status();
  if (mounted->replaced) {
    KVPOOL_LOG(WARNING) << "segment " << name << " restarted; dropping the replicas it held";
    DropRemovedReplicas();
  }
  if (!mounted->already_mounted) {
    KVPOOL_LOG(INFO) << "mounted segment " << name << " ("
                     << mounted->segment->allocator().capacity() << " bytes at "
                     << mounted->segment->info().endpoint << ")";
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> Master::UnmountSegment(const std::string& name, uint64_t incarnation) {
  absl::StatusOr<SegmentId> removed = segments_.Unmount(name, incarnation);
  if (!removed.ok()) return removed.status();
  uint64_t dropped = DropRemovedReplicas();
  KVPOOL_LOG(INFO) << "unmounted segment " << name << "; " << dropped
                   << " objects lost their last replica";
  return dropped;
}

bool Master::Heartbeat(const std::string& name, uint64_t incarnation) {
  return segments_.Heartbeat(name, incarnation, options_.clock());
}

size_t Master::ExpireSegments() {
  std::vector<std::shared_ptr<MountedSegment>> expired =
      segments_.RemoveExpired(options_.clock(), options_.segment_ttl);
  for (const auto& segment : expired) {
    KVPOOL_LOG(WARNING) << "segment " << segment->info().name << " missed heartbeats for "
                        << options_.segment_ttl << "; declared dead";
  }
  if (!expired.empty()) DropRemovedReplicas();
  return expired.size();
}

uint64_t Master::DropRemovedReplicas() {
  uint64_t dropped = 0;
  for (IndexShard& shard : shards_) dropped += shard.DropRemovedReplicas();
  return dropped;
}

absl::StatusOr<std::vector<PutStartResult>> Master::BatchPutStart(
    absl::Span<const std::string> keys, absl::Span<const uint64_t> sizes, uint32_t replica_num) {
  if (keys.size() != sizes.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(keys.size(), " keys but ", sizes.size(), " sizes"));
  }
  replica_num = std::max<uint32_t>(replica_num, 1);
  absl::Time now = options_.clock();
  absl::Time expiry = now + options_.put_timeout;
  std::vector<std::shared_ptr<MountedSegment>> segments = segments_.List();
  uint64_t largest = 0;
  for (const auto& segment : segments) {
    largest = std::max(largest, segment->allocator().capacity());
  }

  std::vector<PutStartResult> results(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    PutStartResult& result = results[i];
    result.status = ValidateKey(keys[i]);
    if (!result.status.ok()) continue;
    if (sizes[i] == 0) {
      result.status = ErrorStatus(v1::INVALID_PARAMS, "size is 0");
      continue;
    }
    if (segments.empty()) {
      result.status = ErrorStatus(v1::NO_AVAILABLE_HANDLE, "no segment is mounted");
      continue;
    }
    if (sizes[i] > largest) {
      result.status = ErrorStatus(
          v1::INVALID_PARAMS, absl::StrCat("size ", sizes[i], " is larger than any segment (",
                                           largest, " bytes)"));
      continue;
    }
    uint64_t put_id = next_put_id_.fetch_add(1);
    // Step P1: reserve space on distinct segments.
    absl::StatusOr<ObjectView> reserved =
        ShardFor(keys[i]).Reserve(keys[i], sizes[i], replica_num, put_id, segments, expiry);
    if (!reserved.ok()) {
      result.status = reserved.status();
      continue;
    }
    result.put_id = put_id;
    for (const Replica& replica : reserved->replicas) {
      result.placements.push_back(MakePlacement(replica, sizes[i], wire::Opcode::kWrite, expiry));
    }
  }
  return results;
}

std::vector<absl::Status> Master::BatchPutEnd(absl::Span<const PutRef> puts) {
  std::vector<absl::Status> results;
  results.reserve(puts.size());
  for (const PutRef& put : puts) {
    absl::Status valid = ValidateKey(put.key);
    // Step P3: the object becomes visible.
    results.push_back(valid.ok() ? ShardFor(put.key).Commit(put.key, put.put_id) : valid);
  }
  return results;
}

std::vector<absl::Status> Master::BatchPutRevoke(absl::Span<const PutRef> puts) {
  std::vector<absl::Status> results;
  results.reserve(puts.size());
  for (const PutRef& put : puts) {
    absl::Status valid = ValidateKey(put.key);
    results.push_back(valid.ok() ? ShardFor(put.key).Revoke(put.key, put.put_id) : valid);
  }
  return results;
}

std::vector<GetResult> Master::BatchGetReplicaList(absl::Span<const std::string> keys) {
  absl::Time expiry = options_.clock() + options_.read_token_ttl;
  std::vector<GetResult> results(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    GetResult& result = results[i];
    result.status = ValidateKey(keys[i]);
    if (!result.status.ok()) continue;
    // Step G1: committed replicas, with read tokens.
    absl::StatusOr<ObjectView> object = ShardFor(keys[i]).Lookup(keys[i]);
    if (!object.ok()) {
      result.status = object.status();
      continue;
    }
    result.size = object->size;
    for (const Replica& replica : object->replicas) {
      result.replicas.push_back(MakePlacement(replica, object->size, wire::Opcode::kRead, expiry));
    }
  }
  return results;
}

std::vector<absl::StatusOr<bool>> Master::BatchExist(absl::Span<const std::string> keys) {
  std::vector<absl::StatusOr<bool>> results;
  results.reserve(keys.size());
  for (const std::string& key : keys) {
    absl::Status valid = ValidateKey(key);
    if (!valid.ok()) {
      results.push_back(valid);
      continue;
    }
    results.push_back(ShardFor(key).Lookup(key).ok());
  }
  return results;
}

std::vector<absl::Status> Master::BatchRemove(absl::Span<const std::string> keys) {
  std::vector<absl::Status> results;
  results.reserve(keys.size());
  for (const std::string& key : keys) {
    absl::Status valid = ValidateKey(key);
    results.push_back(valid.ok() ? ShardFor(key).Remove(key) : valid);
  }
  return results;
}

uint64_t Master::RemoveAll() {
  uint64_t removed = 0;
  for (IndexShard& shard : shards_) removed += shard.RemoveAll();
  return removed;
}

ClusterSummary Master::GetClusterSummary() const {
  ClusterSummary summary;
  absl::Time now = options_.clock();
  for (const auto& segment : segments_.List()) {
    SegmentSummary s;
    s.name = segment->info().name;
    s.host = segment->info().host;
    s.endpoint = segment->info().endpoint;
    s.capacity_bytes = segment->allocator().capacity();
    s.used_bytes = segment->allocator().used();
    s.replicas = segment->replica_count();
    s.embedded = segment->info().embedded;
    s.heartbeat_age = s.embedded ? absl::ZeroDuration() : now - segment->last_heartbeat();
    summary.capacity_bytes += s.capacity_bytes;
    summary.used_bytes += s.used_bytes;
    summary.segments.push_back(std::move(s));
  }
  for (const IndexShard& shard : shards_) {
    IndexShard::Counts counts = shard.counts();
    summary.objects += counts.committed;
    summary.pending_objects += counts.pending;
  }
  return summary;
}

}  // namespace kvpool::master
