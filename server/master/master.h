#pragma once

// The master's core: the object index, the mounted segments and the rules of a put and a
// get, with no sockets in sight. The gRPC service (grpc_service.h) is a thin shell over it,
// and tests drive it directly with an injected clock. Thread-safe.
//
// Life of a put: BatchPutStart reserves space and mints write tokens (step P1), the client
// writes the bytes (P2), BatchPutEnd commits (P3). Life of a get: BatchGetReplicaList
// answers placements with read tokens (G1), the client reads the bytes (G2).
// docs/data_path.md follows the same steps.

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "proto/frame.h"
#include "server/master/index_shard.h"
#include "server/master/segment_registry.h"

namespace kvpool::master {

struct MasterOptions {
  // Longest key accepted, in bytes.
  uint32_t max_key_bytes = 4096;
  // A reservation not committed within this time is reclaimed; write tokens expire with it.
  absl::Duration put_timeout = absl::Seconds(60);
  // How long a read token from BatchGetReplicaList stays valid.
  absl::Duration read_token_ttl = absl::Seconds(60);
  // Told to segments at mount; a segment silent for segment_ttl is declared dead.
  absl::Duration heartbeat_interval = absl::Seconds(1);
  absl::Duration segment_ttl = absl::Seconds(10);
  // Time source; tests inject their own.
  std::function<absl::Time()> clock = [] { return absl::Now(); };
};

// Where a client writes or reads one replica.
struct PlacementView {
  std::string segment_name;
  std::string host;
  std::string endpoint;
  uint64_t offset = 0;
  uint64_t length = 0;
  wire::Token token{};
};

struct PutStartResult {
  // OK, AlreadyExists (dedup), ResourceExhausted (pressure), InvalidArgument (bad key/size).
  absl::Status status;
  uint64_t put_id = 0;
  std::vector<PlacementView> placements;
};

struct PutRef {
  std::string key;
  uint64_t put_id = 0;
};

struct GetResult {
  // OK, NotFound, or InvalidArgument for a bad key.
  absl::Status status;
  uint64_t size = 0;
  std::vector<PlacementView> replicas;
};

struct SegmentSummary {
  std::string name;
  std::string host;
  std::string endpoint;
  uint64_t capacity_bytes = 0;
  uint64_t used_bytes = 0;
  uint64_t replicas = 0;
  bool embedded = false;
  absl::Duration heartbeat_age;
};

struct ClusterSummary {
  uint64_t capacity_bytes = 0;
  uint64_t used_bytes = 0;
  uint64_t objects = 0;
  uint64_t pending_objects = 0;
  std::vector<SegmentSummary> segments;
};

class Master {
 public:
  static constexpr size_t kNumShards = 64;

  explicit Master(MasterOptions options = {});

  const MasterOptions& options() const { return options_; }

  // --- Segments ---
  // InvalidArgument for a malformed mount. Mounting a new incarnation under a known name
  // drops the objects of the old one.
  absl::Status MountSegment(SegmentInfo info);
  // NotFound unless mounted with this incarnation. Returns the objects dropped with it.
  absl::StatusOr<uint64_t> UnmountSegment(const std::string& name, uint64_t incarnation);
  // False if the segment is unknown (it should mount again).
  bool Heartbeat(const std::string& name, uint64_t incarnation);
  // Declares dead the segments silent for longer than segment_ttl; returns how many.
  size_t ExpireSegments();

  // --- Objects: one result per key, in order ---
  // InvalidArgument (whole call) if keys and sizes differ in length.
  absl::StatusOr<std::vector<PutStartResult>> BatchPutStart(absl::Span<const std::string> keys,
                                                            absl::Span<const uint64_t> sizes,
                                                            uint32_t replica_num);
  std::vector<absl::Status> BatchPutEnd(absl::Span<const PutRef> puts);
  std::vector<absl::Status> BatchPutRevoke(absl::Span<const PutRef> puts);
  std::vector<GetResult> BatchGetReplicaList(absl::Span<const std::string> keys);
  // True/false per key, or InvalidArgument for a bad key.
  std::vector<absl::StatusOr<bool>> BatchExist(absl::Span<const std::string> keys);
  std::vector<absl::Status> BatchRemove(absl::Span<const std::string> keys);
  uint64_t RemoveAll();

  ClusterSummary GetClusterSummary() const;

 private:
  IndexShard& ShardFor(absl::string_view key);
  const IndexShard& ShardFor(absl::string_view key) const;
  // InvalidArgument (INVALID_KEY) for an empty or too long key.
  absl::Status ValidateKey(absl::string_view key) const;
  PlacementView MakePlacement(const Replica& replica, uint64_t size, wire::Opcode opcode,
                              absl::Time expiry) const;
  // Returns the number of objects that lost their last replica.
  uint64_t DropRemovedReplicas();

  const MasterOptions options_;
  SegmentRegistry segments_;
  std::array<IndexShard, kNumShards> shards_;
  std::atomic<uint64_t> next_put_id_;
};

}  // namespace kvpool::master
