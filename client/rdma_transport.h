#pragma once

// The RDMA transport: one-sided RDMA READ/WRITE between the caller's buffers and a segment's
// registered pool over a reliable-connected queue pair per segment. The queue pair is set up
// over a data-plane TCP connection (RDMA_CONNECT, proto/rdma_handshake.h) that proves the
// client holds a grant of the segment, and lives as long as that connection.
//
// Caller buffers must be registered with the device: Register() does it up front (engines
// register their KV-cache staging memory once); buffers that are not are registered on first
// use and kept. An op that cannot run over RDMA (no device, segment without RDMA, failed
// completion) fails here and the routing transport moves it over TCP. Thread-safe.

#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "client/transport.h"
#include "rdma/rdma_device.h"

namespace kvpool::client {

class RdmaTransport {
 public:
  // Opens `device_name` (empty: the first device) on first use.
  explicit RdmaTransport(std::string device_name) : device_name_(std::move(device_name)) {}
  ~RdmaTransport();

  // Whether a device could be opened (tried once).
  bool available() ABSL_LOCKS_EXCLUDED(mu_);

  // Registers caller memory for transfers (Unavailable without a device).
  absl::Status Register(void* addr, size_t length) ABSL_LOCKS_EXCLUDED(mu_);

  // Runs every op; each gets OK or why it could not run over RDMA.
  void Execute(absl::Span<TransferOp* const> ops, absl::Time deadline) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Connection {
    absl::Mutex mu;  // one batch at a time on a queue pair
    int fd = -1;     // the TCP connection the queue pair lives with
    std::unique_ptr<rdma::QueuePair> queue_pair;
    rdma::QueuePairInfo remote;
  };

  absl::StatusOr<Connection*> ConnectionFor(const TransferOp& op, absl::Time deadline)
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<uint32_t> LocalKey(const void* addr, size_t length) ABSL_LOCKS_EXCLUDED(mu_);
  // Runs the ops of one segment on its queue pair; false if the queue pair broke.
  bool RunOnConnection(Connection& connection, absl::Span<TransferOp* const> ops,
                       absl::Time deadline);
  void Drop(const std::string& endpoint) ABSL_LOCKS_EXCLUDED(mu_);

  const std::string device_name_;
  absl::Mutex mu_;
  bool tried_ ABSL_GUARDED_BY(mu_) = false;
  std::shared_ptr<rdma::Device> device_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::unique_ptr<Connection>> connections_ ABSL_GUARDED_BY(mu_);
  // Segments that could not set up RDMA (none there, refused), and until when not to ask.
  absl::flat_hash_map<std::string, absl::Time> retry_after_ ABSL_GUARDED_BY(mu_);
  // Registered memory by start address.
  std::map<uint64_t, std::shared_ptr<rdma::MemoryRegion>> regions_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvpool::client
