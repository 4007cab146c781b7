#pragma once

// kvpool's C++ client: stores and fetches KV-cache objects. It asks the master where a value
// goes or lives, then moves the bytes straight between the caller's buffers and the segment.
//
// Values are gathered from, and scattered into, several caller buffers (a KV chunk is one
// buffer per layer and K/V), with no staging copy. Every call has a deadline. The client
// survives a master restart: calls fail with Unavailable while it is down and succeed again
// once it is back.
//
// Thread-safe; share one Client per process.
//
// Errors per key (see ToErrorCode for the numeric, Mooncake-compatible codes):
//   OK                  done.
//   AlreadyExists       (put) the key is stored or being stored: nothing was written.
//   ResourceExhausted   (put) no space even after eviction: back off (NO_AVAILABLE_HANDLE).
//   NotFound            (get, remove) no committed object has the key.
//   FailedPrecondition  (remove) a reader holds a lease on the object (OBJECT_HAS_LEASE).
//   DataLoss            (get) the bytes read do not match the writer's checksum.
//   Aborted             (get) the read outlasted its lease and the bytes changed
//                       (LEASE_EXPIRED): try again.
//   InvalidArgument     empty or too long key, size 0 or larger than any segment.
//   OutOfRange          (get) the buffers are smaller than the object.
//   Unavailable         the master or segment could not be reached (RPC_FAIL, TRANSFER_FAIL);
//                       (put) WRITE_FAIL: committed, but a replica's segment did not record
//                       it durably in time (retried 3 times first): put again later.
//   DeadlineExceeded    the call ran past its deadline.
//   PermissionDenied    a segment refused the request's capability token.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/pin_mode.h"

namespace kvpool {

class ClientBuilder;

// Caller-owned memory; it must stay valid until the call that uses it returns.
struct ConstBuffer {
  const void* data = nullptr;
  size_t size = 0;
};
struct MutableBuffer {
  void* data = nullptr;
  size_t size = 0;
};

// How the client moves bytes to and from segments.
enum class TransportKind {
  // The fastest both sides have: shared memory with a segment on this host, RDMA where both
  // have a device, TCP otherwise.
  kAuto,
  kTcp,
  // Same-host segments only; others still use TCP.
  kSharedMemory,
  kRdma,
};

struct ClientOptions {
  // gRPC address of kvpool-master: "host:port"; or, with several masters elected through
  // etcd, "host:port,host:port,..." or "etcd://host:port[,host:port]". Calls then go to the
  // leader and follow it across fail-overs: a call in flight when the leader dies fails
  // Unavailable (RPC_FAIL, retryable) unless a new leader answers before its deadline.
  std::string master_address = "127.0.0.1:50051";
  // TLS to the master: the CA that signed its certificate (empty: plaintext, which only a
  // master on loopback or one started with --insecure accepts); this client's certificate and
  // key for mutual TLS (both or neither); the name to check the master's certificate against
  // (default: the host of master_address). The files are re-read when they change.
  std::string tls_ca_file;
  std::string tls_cert_file;
  std::string tls_key_file;
  std::string tls_server_name;
  // TLS on the TCP data connections too (segments started with --data-tls; all of this
  // pool's segments must be): each segment's certificate is verified against tls_ca_file and
  // its name against the host the segment advertises; tls_cert_file/tls_key_file are
  // presented for mutual TLS. Shared memory and RDMA are not affected.
  bool data_tls = false;
  // Bearer token the master knows this client by (a "token" rule of its --auth-tokens file):
  // sets this client's role and tenant. Empty: none (a certificate, or no authentication).
  std::string auth_token;
  // Deadline of every call to the master.
  absl::Duration rpc_timeout = absl::Seconds(5);
  // Deadline for moving the bytes of one batch.
  absl::Duration transfer_timeout = absl::Seconds(30);
  // Create() waits this long for the master to answer.
  absl::Duration connect_timeout = absl::Seconds(5);
  // Parallel data connections per segment within one batch.
  int connections_per_segment = 2;
  TransportKind transport = TransportKind::kAuto;
  // RDMA device for kAuto/kRdma: a name, or empty for the first one found.
  std::string rdma_device;
  // Check every value read against its writer's checksum (XXH3-64): a value whose bytes
  // differ is DataLoss (CHECKSUM_MISMATCH), never returned as OK. On by default; turning it
  // off trades that guarantee for the hashing cost (docs/benchmarks.md), and reads that
  // outlast their lease or use a cached location are still checked.
  bool verify_checksums = true;
  // Reuse the master's answer for a key (where its replicas are) until half the lease that
  // answer granted has run, and while more than 2 s of it is left, instead of asking again
  // (then the answer is renewed before it is used): a repeated get then costs one
  // data-plane round trip. The lease keeps the object from being evicted or removed
  // meanwhile; only a forced remove by another client could pull it away.
  bool cache_locations = true;
  // Read a key with no kept location straight from its home segment (READ_KEY,
  // docs/protocol.md), without asking the master: one data-plane round trip for a key's first
  // get. The value is always checked against the checksum the segment holds for it; a key
  // not there (placed elsewhere, removed) is then asked of the master as before. Only where
  // the value would come over TCP: a home that shared memory (on this machine) or RDMA
  // reaches is read through the master and a kept location, which costs no TCP round trip.
  bool read_by_key = true;
  // This machine's host name as segments advertise it: replicas on this host are read
  // first, and PutOptions::prefer_local_segment puts new objects here. Default: hostname.
  std::string local_host;
};

struct PutOptions {
  // Copies on distinct segments (as many as have room, at least one).
  uint32_t replicas = 1;
  PinMode pin = PinMode::kNone;
  // Place on a segment of this host when one has room.
  bool prefer_local_segment = false;
  // Segments (by name) tried before any other, in this order, when they have room (Mooncake's
  // preferred_segment(s)); names no mounted segment has are ignored.
  std::vector<std::string> preferred_segments;
};

struct GetOptions {
  // Check the bytes read against the writer's checksum even where
  // ClientOptions::verify_checksums is off: DataLoss (CHECKSUM_MISMATCH) if they differ.
  bool verify_checksum = false;
};

// One value to store: the concatenation of `parts`.
struct PutItem {
  std::string key;
  std::vector<ConstBuffer> parts;
};

// One value to fetch, scattered over `parts` in order; they must hold at least its size.
struct GetItem {
  std::string key;
  std::vector<MutableBuffer> parts;
};

// A value's bytes inside a pool this process has mapped (shared memory).
struct LocalValue {
  uint8_t* data = nullptr;
  uint64_t size = 0;
  // The XXH3-64 its writer recorded (0: none), for a reader that checks the bytes itself.
  uint64_t checksum = 0;
};

// Space reserved in a pool this process has mapped: fill data[0, size), then commit.
struct LocalReservation {
  std::string key;
  uint8_t* data = nullptr;
  uint64_t size = 0;
  uint64_t put_id = 0;
  // Commit before this, or the reservation is reclaimed.
  absl::Time deadline;
  // The XXH3-64 of the bytes written, if the writer computed it where they came from (a GPU
  // hashing the blocks it gathers): BatchCommitLocal records it as given and does not hash the
  // pool memory. Nullopt: BatchCommitLocal hashes data[0, size) itself.
  std::optional<uint64_t> checksum;
  // The segment's data-plane endpoint, and the write intent that lets this process write
  // data[0, size) (the segment refuses other writes into the range until it is committed
  // or abandoned).
  std::string endpoint;
  uint64_t write_intent = 0;
};

// A pool this process has mapped, e.g. to register with a GPU driver (cudaHostRegister) so
// that a GPU copies straight between its memory and the pool.
struct MappedPool {
  std::string endpoint;
  uint8_t* base = nullptr;
  uint64_t size = 0;
};

// Where one replica of an object lives: its segment, the segment's data-plane endpoint, and
// the replica's byte range in the segment's pool.
struct ReplicaLocation {
  std::string segment_name;
  std::string endpoint;
  uint64_t offset = 0;
  uint64_t length = 0;
};

struct SegmentStatus {
  std::string name;
  std::string host;
  std::string endpoint;
  uint64_t capacity_bytes = 0;
  uint64_t used_bytes = 0;
  uint64_t replicas = 0;
  std::string state;
  absl::Duration last_heartbeat_age;
};

struct ClusterStatus {
  uint64_t capacity_bytes = 0;
  uint64_t used_bytes = 0;
  uint64_t objects = 0;
  uint64_t pending_objects = 0;
  uint64_t leased_objects = 0;
  uint64_t soft_pinned_objects = 0;
  uint64_t hard_pinned_objects = 0;
  uint64_t evicted_objects = 0;
  uint64_t evicted_bytes = 0;
  uint64_t reclaimed_reservations = 0;
  // Keys looked up and found or not (cache hits and misses), and keys whose put was
  // deduplicated or met pressure (NO_AVAILABLE_HANDLE), since the master started.
  uint64_t get_hits = 0;
  uint64_t get_misses = 0;
  uint64_t put_deduplicated = 0;
  uint64_t put_no_space = 0;
  std::vector<SegmentStatus> segments;
  // High availability: "single" (one master, no etcd), "leader" or "standby" (the master
  // that answered; a standby answers only when no leader does); the leader's term (0 for a
  // single master), its address, every registered master, and the master that answered.
  std::string role = "single";
  int64_t term = 0;
  std::string leader;
  std::vector<std::string> masters;
  std::string answered_by;
};

struct DrainReport {
  uint64_t moved_objects = 0;
  uint64_t moved_bytes = 0;
  // Copies that failed (read, checksum or write); the master offers each again, up to 3 times.
  uint64_t failed_copies = 0;
  // Objects left to be dropped with the segment: no room elsewhere, or failed 3 times.
  uint64_t unplaceable = 0;
};

struct DrainOptions {
  // Copy the segment's objects elsewhere first (else they are dropped with it; those with a
  // replica on another segment stay readable either way).
  bool migrate = true;
  // Copies per round trip to the master, and at most about this many bytes in memory.
  size_t batch_objects = 256;
  uint64_t batch_bytes = 64ull << 20;
  // Called after each batch with the totals so far.
  std::function<void(const DrainReport&)> progress;
};

class Client {
 public:
  // Unavailable if the master does not answer within options.connect_timeout.
  static absl::StatusOr<std::unique_ptr<Client>> Create(const ClientOptions& options);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  absl::Status Put(absl::string_view key, absl::Span<const ConstBuffer> parts,
                   const PutOptions& options = {});
  absl::Status Put(absl::string_view key, absl::string_view value, const PutOptions& options = {});
  // One status per item, in order.
  std::vector<absl::Status> BatchPut(absl::Span<const PutItem> items,
                                     const PutOptions& options = {});

  // Returns the object's size in bytes. Grants the caller a lease on the object.
  absl::StatusOr<uint64_t> Get(absl::string_view key, absl::Span<const MutableBuffer> parts,
                               const GetOptions& options = {});
  absl::StatusOr<std::string> Get(absl::string_view key, const GetOptions& options = {});
  // Bytes read per item, in order.
  std::vector<absl::StatusOr<uint64_t>> BatchGet(absl::Span<const GetItem> items,
                                                 const GetOptions& options = {});

  // Size of a committed object.
  absl::StatusOr<uint64_t> Size(absl::string_view key);
  // A key that exists is leased to the caller, as by a get.
  absl::StatusOr<bool> Exists(absl::string_view key);
  std::vector<absl::StatusOr<bool>> BatchExist(absl::Span<const std::string> keys);

  // `force` removes objects that readers hold a lease on.
  absl::Status Remove(absl::string_view key, bool force = false);
  std::vector<absl::Status> BatchRemove(absl::Span<const std::string> keys, bool force = false);
  // Per key: drops its replica on the segment named `segment`, leaving the others (an
  // object whose only replica it was is removed). OK; NotFound (no such object, or no replica
  // there); OBJECT_HAS_LEASE (a reader's lease, unless `force`); InvalidArgument (empty
  // segment name); WRITE_FAIL (dropped, not yet durable: retry).
  std::vector<absl::Status> BatchDropReplicas(absl::Span<const std::string> keys,
                                              absl::string_view segment, bool force = false);
  // Gives `key`'s object a replica on each segment of `targets` (names), copying it as a
  // drain's mover does (read from one of its replicas, checked against its checksum, written
  // to space the master reserved), one target at a time; a target holding one already is
  // skipped. With `move_from` (the name of a segment holding a replica; one target), the new
  // replica takes that one's place at the master in one step, so the object never lacks a
  // committed replica. While a copy is in flight the object is leased. A failure leaves the
  // object as it was (with the replicas made before it). Returns when done:
  //   NotFound            no committed object has the key.
  //   InvalidArgument     (INVALID_PARAMS) no targets, a segment no one mounted, a move's
  //                       source without a replica or equal to its target.
  //   FailedPrecondition  (UNAVAILABLE_IN_CURRENT_STATUS) a target takes no new objects.
  //   ResourceExhausted   (NO_AVAILABLE_HANDLE) a target has no room.
  //   Unavailable         (TRANSFER_FAIL) the copy could not be read or written; (WRITE_FAIL)
  //                       made, but its segment did not record it in time.
  absl::Status CopyReplica(absl::string_view key, absl::Span<const std::string> targets,
                           absl::string_view move_from = {});
  // The checks of CopyReplica only (its errors but the transfer's), reserving nothing: what a
  // copy or move task answers when it is created.
  absl::Status CheckCopyReplica(absl::string_view key, absl::Span<const std::string> targets,
                                absl::string_view move_from = {});
  // Removes every committed object (leased ones only if `force`); returns how many.
  absl::StatusOr<uint64_t> RemoveAll(bool force = false);
  // Removes the committed objects whose key `pattern` (an RE2 regular expression: ECMAScript's
  // syntax without backreferences or lookaround) matches somewhere in, leased ones only if
  // `force`; returns how many. InvalidArgument for a malformed pattern.
  absl::StatusOr<uint64_t> RemoveByRegex(absl::string_view pattern, bool force = false);

  // Where each key's committed replicas live; a key that exists is leased, as by a get.
  // NotFound per absent key.
  std::vector<absl::StatusOr<std::vector<ReplicaLocation>>> BatchReplicaLocations(
      absl::Span<const std::string> keys);

  absl::StatusOr<ClusterStatus> GetClusterStatus();

  // --- Zero-copy access to segments on this machine (shared memory) ---
  // For engines that move blocks between a GPU and the pool in one copy: no staging buffer,
  // no memcpy by the client. Only for segments on this machine that admit this client.

  // Where each key's bytes sit in a mapped pool, leased as by a get: read them before
  // `*lease_expiry` (the object is neither evicted nor removed until then). NotFound if
  // absent; FailedPrecondition if no replica is on a segment this process can map.
  std::vector<absl::StatusOr<LocalValue>> BatchGetLocal(absl::Span<const std::string> keys,
                                                        absl::Time* lease_expiry);
  // Reserves space for each key on a segment of this machine (one replica), with a write
  // intent the segment accepted (the range is this caller's to fill until it commits or
  // abandons). AlreadyExists and ResourceExhausted as for BatchPut; FailedPrecondition if the
  // space could only be found on another machine, and the segment's refusal of the intent
  // (e.g. TRANSFER_FAIL: the range is busy, put again) otherwise (nothing is reserved then).
  std::vector<absl::StatusOr<LocalReservation>> BatchReserveLocal(
      absl::Span<const std::string> keys, absl::Span<const uint64_t> sizes,
      const PutOptions& options = {});
  // Commits filled reservations: computes their checksums (those not given with the
  // reservation) and makes them visible. NotFound if
  // a reservation was reclaimed (its deadline passed).
  std::vector<absl::Status> BatchCommitLocal(absl::Span<const LocalReservation> reservations);
  // Gives unfilled reservations back.
  void BatchAbandonLocal(absl::Span<const LocalReservation> reservations);
  // The pools mapped so far (a pool is mapped on first use of its segment).
  std::vector<MappedPool> MappedPools();
  // Maps the pools of every segment on this machine that admits this client, now.
  void MapLocalPools();

  // Registers memory the caller will transfer from or into often (an engine's KV-cache
  // staging buffers), so RDMA need not register it on first use. Unavailable when this
  // machine has no RDMA device (nothing to do then: the other transports need no
  // registration).
  absl::Status RegisterMemory(void* addr, size_t length);
  // Stops new objects going to the segment and, with `options.migrate`, copies its objects
  // to other segments (reading them from the draining segment, checking their checksums,
  // writing them where the master says) before the master unmounts it; it is unmounted once
  // nothing on it is leased or being written. Returns when the copying is done; what could
  // not be copied (no room elsewhere, or failed 3 times) is dropped with the segment.
  // NotFound (SEGMENT_NOT_FOUND) for an unknown name.
  absl::StatusOr<DrainReport> DrainSegment(absl::string_view name, const DrainOptions& options = {});

  // This client's own metrics in the Prometheus text format (put/get latency histograms and
  // bytes moved), for an engine to append to its own /metrics endpoint. For prometheus-cpp
  // registries, kvpool/client_metrics.h offers the same as a prometheus::Collectable.
  std::string MetricsText() const;

 private:
  friend class ClientMetrics;
  friend class ClientBuilder;
  struct Impl;
  explicit Client(std::unique_ptr<Impl> impl);
  // Tells the segments that these reservations' writes are done (their write intents).
  void EndLocalWrites(absl::Span<const LocalReservation> reservations);
  std::unique_ptr<Impl> impl_;
};

// The Mooncake-compatible numeric code of a status from this client: 0 OK, -200
// NO_AVAILABLE_HANDLE, -704 OBJECT_NOT_FOUND, -705 OBJECT_ALREADY_EXISTS, -800 TRANSFER_FAIL,
// -900 RPC_FAIL, ... (docs/semantics.md lists them all). Defined with the wire codes.
int32_t ToErrorCode(const absl::Status& status);

// "NO_AVAILABLE_HANDLE" for -200.
std::string ErrorCodeName(int32_t code);

}  // namespace kvpool
