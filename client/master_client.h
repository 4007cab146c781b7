#pragma once

// The client's view of kvpool-master, in the client's own types: the one place in client/
// (with tools that speak to the master on purpose) that sees the v1 protos. The gRPC
// implementation (MakeGrpcMasterClient) builds each request, converts each answer once
// (codes to absl::Status, PinMode, tokens to wire::Token), and checks each answer's shape
// (one result per key, placements as long as the object, tokens of the right size) so the
// client's policy code (client.cc) never does. Tests give the client a fake instead.
//
// Every call has the deadline of ClientOptions::rpc_timeout; a call the master could not be
// reached for fails with RPC_FAIL. With several masters (a list or etcd://, see
// proto/master_locator.h) a call goes to the leader: a standby's refusal (the call was not
// executed) sends it on to the leader the standby names, or, during an election, to the
// others again until the deadline; a master that does not answer is tried at most once per
// call (a call whose answer was lost may have been executed), and the call fails Unavailable
// (retryable) once no master is left. Implementations are thread-safe.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "kvpool/client.h"
#include "proto/frame.h"
#include "proto/master_locator.h"
#include "proto/tls.h"

namespace kvpool::client {

// One replica's range on one segment, and the capability token the segment checks before it
// serves the range. The token is opaque: it goes to the segment as the master minted it.
struct Placement {
  std::string segment_name;
  std::string endpoint;  // the segment's data plane, "host:port"
  std::string host;      // the segment's host, as it advertises it
  uint64_t incarnation = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
  wire::Token token{};
};

// How BatchGetReplicaList asks.
struct LocateOptions {
  // Within this if given (shorter than rpc_timeout: a renewal of cached locations).
  std::optional<absl::Duration> timeout;
  // Placements with read tokens. Without (Placement::token zero), for a caller that reads
  // through pools it has mapped (Client::BatchGetLocal), where no token is checked: the
  // master mints none (about a microsecond each) and sends none.
  bool tokens = true;
};

// Where a key's replicas are (step G1). Unless status is OK, the rest is empty. An OK
// location has at least one replica, each as long as `size`.
struct Location {
  absl::Status status;
  uint64_t size = 0;
  uint64_t checksum = 0;  // XXH3-64 of the value as written (0: none)
  // The lease the answer granted (the object is neither evicted nor removed, unless forced,
  // and the read tokens stay valid) and when it ends, counted from when the call was sent.
  absl::Duration lease;
  absl::Time lease_expiry;
  std::vector<Placement> replicas;
};

// A new object's reservation (step P1). Unless status is OK, the rest is empty. An OK
// reservation has at least one placement, each as long as the object.
struct Reservation {
  absl::Status status;
  // Not 0 whenever the master reserved space, even where status says its answer was bad
  // (placements of the wrong length): revoke it then.
  uint64_t put_id = 0;
  // Commit before this, or the reservation is reclaimed and its writes refused (the master
  // states it; InfinitePast from a master that did not).
  absl::Time deadline = absl::InfinitePast();
  std::vector<Placement> placements;
};

struct PutStartRequest {
  std::vector<std::string> keys;
  std::vector<uint64_t> sizes;  // one per key
  uint32_t replicas = 1;
  PinMode pin = PinMode::kNone;
  // Empty: no preference.
  std::string preferred_host;
  std::string preferred_machine_id;
  std::vector<std::string> preferred_segments;
};

// A reservation to commit (with the value's checksum) or revoke (checksum unused).
struct PutEnd {
  std::string key;
  uint64_t put_id = 0;
  uint64_t checksum = 0;
};

// One object to copy from `source` to `destination` (a drain, or a replica copy).
struct Migration {
  std::string key;
  uint64_t migration_id = 0;
  uint64_t size = 0;
  uint64_t checksum = 0;
  Placement source;
  Placement destination;
};

struct MigrationBatch {
  std::vector<Migration> migrations;
  // Objects the master could not place anywhere, and copies still being made elsewhere.
  uint64_t unplaceable = 0;
  uint64_t in_flight = 0;
};

struct MigrationEnd {
  std::string key;
  uint64_t migration_id = 0;
  bool copied = false;
};

// ReplicaCopyStart's answer: OK with the copy to make, or why not (OBJECT_ALREADY_EXISTS,
// OBJECT_HAS_LEASE, ...).
struct CopyStart {
  absl::Status status;
  Migration migration;
};

// What the client needs to know of a segment to route to it.
struct SegmentEntry {
  std::string name;
  std::string endpoint;
  std::string host;
  std::string shm_socket;  // empty: none offered
  std::string machine_id;  // the segment's machine (kernel boot id)
  // Active: neither draining nor restoring (the master places new objects only there).
  bool active = true;
  uint64_t capacity = 0;  // bytes
  // A key-read credential of the caller's tenant for this segment (proto/key_read.h), until
  // key_read_expiry; none for a caller who may not read.
  std::optional<wire::Token> key_read_credential;
  absl::Time key_read_expiry = absl::InfinitePast();
};

struct SegmentList {
  // The caller's tenant, as the master knows it from its credentials (empty: global).
  std::string tenant;
  std::vector<SegmentEntry> segments;
};

class MasterClient {
 public:
  virtual ~MasterClient() = default;

  // Waits up to `timeout` for the master to answer (Unavailable if it does not; the
  // master's refusal of these credentials as it is).
  virtual absl::Status WaitForMaster(absl::Duration timeout) = 0;

  // Whole-call failures are the StatusOr's; per-key answers, one per key in order, inside.
  virtual absl::StatusOr<std::vector<Reservation>> BatchPutStart(
      const PutStartRequest& request) = 0;
  virtual absl::StatusOr<std::vector<absl::Status>> BatchPutEnd(
      absl::Span<const PutEnd> items) = 0;
  virtual absl::Status BatchPutRevoke(absl::Span<const PutEnd> items) = 0;
  virtual absl::StatusOr<std::vector<Location>> BatchGetReplicaList(
      absl::Span<const std::string> keys, const LocateOptions& options = {}) = 0;
  virtual absl::StatusOr<std::vector<absl::StatusOr<bool>>> BatchExist(
      absl::Span<const std::string> keys) = 0;
  // One status per key: the call's failure for every key when the call failed.
  virtual std::vector<absl::Status> BatchRemove(absl::Span<const std::string> keys,
                                                bool force) = 0;
  virtual std::vector<absl::Status> BatchDropReplicas(absl::Span<const std::string> keys,
                                                      absl::string_view segment,
                                                      bool force) = 0;
  // Objects removed; an empty `key_regex` removes all.
  virtual absl::StatusOr<uint64_t> RemoveAll(bool force, absl::string_view key_regex) = 0;
  // The operator's view (scans every object on the master: not for a data path).
  virtual absl::StatusOr<ClusterStatus> GetClusterStatus() = 0;
  // The mounted segments, for routing (cheap: no scan of objects).
  virtual absl::StatusOr<SegmentList> ListSegments() = 0;

  virtual absl::Status DrainSegment(absl::string_view name, bool migrate) = 0;
  virtual absl::StatusOr<MigrationBatch> MigrateStart(absl::string_view segment,
                                                      uint32_t max_objects,
                                                      uint64_t max_bytes) = 0;
  virtual absl::StatusOr<std::vector<absl::Status>> MigrateEnd(
      absl::Span<const MigrationEnd> items) = 0;
  // A dry run answers only whether the copy could start.
  virtual absl::StatusOr<CopyStart> ReplicaCopyStart(absl::string_view key,
                                                     absl::Span<const std::string> targets,
                                                     absl::string_view move_from,
                                                     bool dry_run) = 0;
  virtual absl::StatusOr<std::vector<absl::Status>> ReplicaCopyEnd(
      absl::Span<const MigrationEnd> items) = 0;
};

// The real one, over gRPC. `locator` was made with the same TLS options (its channels use
// them); over TLS when tls.enabled() (validate it first: ValidateClientTls); `auth_token`, if
// not empty, goes with every call (AttachToken).
std::unique_ptr<MasterClient> MakeGrpcMasterClient(std::unique_ptr<MasterLocator> locator,
                                                   absl::Duration rpc_timeout,
                                                   ClientTlsOptions tls = {},
                                                   std::string auth_token = {});

}  // namespace kvpool::client
