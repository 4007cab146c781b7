#pragma once

// The shared-memory transport: for segments on this host that admit this client, the pool is
// mapped into the process and a transfer is one memcpy per caller buffer, no socket, no
// server thread. Admission is a handshake on the segment's Unix socket (proto/shm_handshake.h)
// that hands over the pool's memfd. Grants are still honoured: an op whose token expired is
// refused (LEASE_EXPIRED), as the segment would. Thread-safe.

#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/transport.h"

namespace kvpool::client {

class ShmTransport {
 public:
  // A mapped pool; unmapped when the last reference goes.
  struct Pool {
    uint8_t* base = nullptr;
    uint64_t size = 0;
    // Of the segment process that handed it over (placements name theirs).
    uint64_t incarnation = 0;
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

  // Copies one op between its iovecs and `pool`; sets op.status.
  static void Copy(const Pool& pool, TransferOp& op, absl::Time now);

 private:
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<const Pool>> pools_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvpool::client
