#pragma once

// The shared-memory transport: for segments on this host that admit this client, the pool is
// mapped into the process and a transfer is one memcpy per caller buffer, no socket, no
// server thread. Admission is a handshake on the segment's Unix socket (proto/shm_handshake.h)
// that hands over the pool's memfd; the connection stays open while the pool is mapped.
// Grants are still honoured: every write is fenced by a write intent on that connection
// (BeginWrites before copying, EndWrites after), which the segment checks as it checks a TCP
// write's token, so a writer that wakes after its grant ended is refused and copies nothing;
// a read whose token expired is refused (LEASE_EXPIRED) here. Thread-safe.

#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "client/transport.h"
#include "proto/shm_handshake.h"

namespace kvpool::client {

class ShmTransport {
 public:
  // A mapped pool; unmapped when the last reference goes.
  struct Pool {
    uint8_t* base = nullptr;
    uint64_t size = 0;
    // Of the segment process that handed it over (placements name theirs).
    uint64_t incarnation = 0;
    // The admission connection, kept for the mapping's life: write intents travel on it,
    // one message and its answer at a time. Closing it ends this process's intents.
    int control = -1;
    mutable absl::Mutex control_mu;
    mutable bool broken ABSL_GUARDED_BY(control_mu) = false;
    ~Pool();
  };

  // The pool mapped for `endpoint` if its incarnation is `incarnation` (0: any), else null.
  std::shared_ptr<const Pool> Find(const std::string& endpoint, uint64_t incarnation) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // Asks the segment listening on `socket_path` for its pool and maps it, replacing an older
  // mapping of `endpoint`. PermissionDenied if the segment refuses this client, Unavailable if
  // it cannot be reached.
  absl::StatusOr<std::shared_ptr<const Pool>> Attach(const std::string& endpoint,
                                                      const std::string& socket_path)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Every mapped pool, by endpoint.
  std::vector<std::pair<std::string, std::shared_ptr<const Pool>>> All() const
      ABSL_LOCKS_EXCLUDED(mu_);

  // Drops the mapping of `endpoint` if it is `pool` (its connection broke): the next use
  // attaches afresh.
  void Forget(const std::string& endpoint, const Pool* pool) ABSL_LOCKS_EXCLUDED(mu_);

  // Asks the segment whether each write may start (a write intent per entry, in messages of
  // at most wire::kShmMaxEntries). Per entry: the intent's id (the write may be copied now,
  // and must then be ended with EndWrites), or the segment's refusal with its ErrorCode
  // (PERMISSION_DENIED: forged or ended grant, other term; LEASE_EXPIRED; TRANSFER_FAIL: the
  // range is busy; INVALID_WRITE). Unavailable for all if the connection failed (it is then
  // closed, which ends every intent of it: nothing may be copied).
  static absl::StatusOr<std::vector<absl::StatusOr<uint64_t>>> BeginWrites(
      const Pool& pool, absl::Span<const wire::ShmIntent> intents);
  // Tells the segment these writes are done (copied, or given up). Unavailable if the
  // connection failed (closed then: the segment ends them all the same).
  static absl::Status EndWrites(const Pool& pool, absl::Span<const uint64_t> ids);

  // Copies one op between its iovecs and `pool`; sets op.status. A write must have been
  // accepted by BeginWrites first.
  static void Copy(const Pool& pool, TransferOp& op, absl::Time now);

 private:
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<const Pool>> pools_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvpool::client
