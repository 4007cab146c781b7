#pragma once

// Picks the transport of every op: shared memory for segments on this machine that admit
// the client, RDMA where this machine has a device and the segment serves it, TCP for the
// rest and for every op the others could not run. TCP runs at the same time as the others
// within one batch. Thread-safe.

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "client/rdma_transport.h"
#include "client/shm_transport.h"
#include "client/tcp_transport.h"
#include "client/transport.h"
#include "common/task_pool.h"
#include "kvpool/client.h"

namespace kvpool::client {

class RoutingTransport final : public Transport {
 public:
  // Answers the shared-memory socket of a segment endpoint if the segment runs on this
  // machine and offers one.
  using ShmResolver = std::function<std::optional<std::string>(const std::string& endpoint)>;

  RoutingTransport(TransportKind kind, ShmResolver resolver, TcpTransportOptions tcp_options,
                   std::string rdma_device);

  // Registers caller memory for RDMA (Unavailable without a device; harmless to ignore).
  absl::Status RegisterMemory(void* addr, size_t length) { return rdma_.Register(addr, length); }

  void Execute(absl::Span<TransferOp> ops, absl::Time deadline) override;
  // True for a write that Execute would send over TCP.
  bool HashesWrite(const TransferOp& op) override;

  // The mapped pool of a segment on this machine (attaching on first use), or null when shared
  // memory cannot be used with it.
  std::shared_ptr<const ShmTransport::Pool> LocalPool(const std::string& endpoint,
                                                      uint64_t incarnation)
      ABSL_LOCKS_EXCLUDED(mu_);
  std::vector<std::pair<std::string, std::shared_ptr<const ShmTransport::Pool>>> MappedPools()
      const {
    return shm_.All();
  }

  // Write intents for writes the caller makes itself into a mapped pool (zero-copy puts,
  // Client::BatchReserveLocal): per intent its id or the segment's refusal (see
  // ShmTransport::BeginWrites); a broken connection refuses all (Unavailable) and forgets
  // the mapping. EndLocalWrites tells the segment they are done.
  std::vector<absl::StatusOr<uint64_t>> BeginLocalWrites(
      const std::string& endpoint, const std::shared_ptr<const ShmTransport::Pool>& pool,
      absl::Span<const wire::ShmIntent> intents);
  void EndLocalWrites(const std::string& endpoint, absl::Span<const uint64_t> ids);

  // Whether a read from the segment at `endpoint` would go over shared memory (`local`: the
  // segment is on this machine and offers it) or RDMA, not TCP.
  bool BypassesTcp(bool local) {
    return local ? kind_ == TransportKind::kAuto || kind_ == TransportKind::kSharedMemory
                 : UsesRdma();
  }

  struct Stats {
    uint64_t shm_ops = 0;
    uint64_t rdma_ops = 0;
    uint64_t tcp_ops = 0;
  };
  Stats stats() const;

 private:
  // The mapped pool for this op, attaching on first use; null if shared memory is not to be
  // used for it (another host, off, refused, failed recently).
  std::shared_ptr<const ShmTransport::Pool> PoolFor(const TransferOp& op) ABSL_LOCKS_EXCLUDED(mu_) {
    bool allowed = kind_ == TransportKind::kAuto || kind_ == TransportKind::kSharedMemory;
    return allowed ? LocalPool(op.endpoint, op.incarnation) : nullptr;
  }

  bool UsesRdma() {
    return (kind_ == TransportKind::kAuto || kind_ == TransportKind::kRdma) && rdma_.available();
  }

  // Runs shared-memory ops: reads copied at once, writes fenced by write intents. Returns
  // the writes to run over TCP instead (their pool's connection broke before any copy).
  std::vector<TransferOp*> CopyShared(
      absl::Span<const std::pair<TransferOp*, std::shared_ptr<const ShmTransport::Pool>>> shm_ops);
  // ShmTransport::Copy of every op, on copiers_ as well for large batches (one thread's
  // memcpy leaves most of a host's memory bandwidth unused).
  void CopyAll(absl::Span<const std::pair<const ShmTransport::Pool*, TransferOp*>> ops,
               absl::Time now);

  const TransportKind kind_;
  const ShmResolver resolver_;
  TcpTransport tcp_;
  ShmTransport shm_;
  RdmaTransport rdma_;
  // Runs a batch's TCP ops while the calling thread copies through shared memory or posts
  // RDMA requests (batches that mix them only; threads kept, not spawned per batch).
  TaskPool mixed_{2};
  TaskPool copiers_;
  absl::Mutex mu_;
  // Endpoints where attaching failed, and when to try again.
  absl::flat_hash_map<std::string, absl::Time> retry_after_ ABSL_GUARDED_BY(mu_);
  std::atomic<uint64_t> shm_ops_{0};
  std::atomic<uint64_t> rdma_ops_{0};
  std::atomic<uint64_t> tcp_ops_{0};
};

}  // namespace kvpool::client
