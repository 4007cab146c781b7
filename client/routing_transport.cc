#include "client/routing_transport.h"

#include <thread>

#include "common/log.h"

namespace kvpool::client {
namespace {

// After a failed or refused attach, TCP only for this long before asking again.
constexpr absl::Duration kRetryAttachAfter = absl::Seconds(10);

}  // namespace

RoutingTransport::RoutingTransport(TransportKind kind, ShmResolver resolver,
                                   TcpTransportOptions tcp_options)
    : kind_(kind),
      resolver_(std::move(resolver)),
      tcp_(tcp_options) {}

std::shared_ptr<const ShmTransport::Pool> RoutingTransport::PoolFor(const TransferOp& op) {
  bool shm_allowed = kind_ == TransportKind::kAuto || kind_ == TransportKind::kSharedMemory;
  if (!shm_allowed) return nullptr;
  if (auto pool = shm_.Find(op.endpoint, op.incarnation)) return pool;
  {
    absl::MutexLock lock(&mu_);
    auto it = retry_after_.find(op.endpoint);
    if (it != retry_after_.end() && absl::Now() < it->second) return nullptr;
  }
  // The resolver answers only for segments on this machine.
  std::optional<std::string> socket = resolver_(op.endpoint);
  if (!socket) return nullptr;
  absl::StatusOr<std::shared_ptr<const ShmTransport::Pool>> pool =
      shm_.Attach(op.endpoint, *socket);
  if (pool.ok() && (*pool)->incarnation == op.incarnation) return *pool;
  if (!pool.ok()) {
    KVPOOL_LOG(INFO) << "shared memory with segment " << op.endpoint
                     << " not available, using TCP: " << pool.status().message();
  }
  absl::MutexLock lock(&mu_);
  retry_after_[op.endpoint] = absl::Now() + kRetryAttachAfter;
  return nullptr;
}

void RoutingTransport::Execute(absl::Span<TransferOp> ops, absl::Time deadline) {
  std::vector<TransferOp> tcp_ops;
  std::vector<size_t> tcp_index;
  std::vector<std::pair<TransferOp*, std::shared_ptr<const ShmTransport::Pool>>> shm_ops;
  for (size_t i = 0; i < ops.size(); ++i) {
    if (auto pool = PoolFor(ops[i])) {
      shm_ops.emplace_back(&ops[i], std::move(pool));
    } else {
      tcp_index.push_back(i);
    }
  }
  if (shm_ops.empty()) {
    tcp_ops_.fetch_add(ops.size(), std::memory_order_relaxed);
    tcp_.Execute(ops, deadline);
    return;
  }
  tcp_ops.reserve(tcp_index.size());
  for (size_t i : tcp_index) tcp_ops.push_back(std::move(ops[i]));
  // TCP ops run on their own thread while this one copies through shared memory.
  std::thread tcp_thread;
  if (!tcp_ops.empty()) {
    tcp_thread = std::thread([&] { tcp_.Execute(absl::MakeSpan(tcp_ops), deadline); });
  }
  absl::Time now = absl::Now();
  for (auto& [op, pool] : shm_ops) ShmTransport::Copy(*pool, *op, now);
  if (tcp_thread.joinable()) tcp_thread.join();
  for (size_t k = 0; k < tcp_index.size(); ++k) ops[tcp_index[k]] = std::move(tcp_ops[k]);
  shm_ops_.fetch_add(shm_ops.size(), std::memory_order_relaxed);
  tcp_ops_.fetch_add(tcp_ops.size(), std::memory_order_relaxed);
}

RoutingTransport::Stats RoutingTransport::stats() const {
  return Stats{shm_ops_.load(), tcp_ops_.load()};
}

}  // namespace kvpool::client
