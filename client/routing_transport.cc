#include "client/routing_transport.h"

#include <algorithm>
#include <thread>

#include "common/log.h"

namespace kvpool::client {
namespace {

// After a failed or refused attach, TCP only for this long before asking again.
constexpr absl::Duration kRetryAttachAfter = absl::Seconds(10);

// A batch's shared-memory copies are shared among threads from this many bytes on ...
constexpr uint64_t kParallelCopyBytes = uint64_t{8} << 20;
// ... by the caller and this many more: a few reach a host's memory bandwidth.
int CopyThreads() {
  return std::clamp(static_cast<int>(std::thread::hardware_concurrency()) - 1, 1, 3);
}

}  // namespace

RoutingTransport::RoutingTransport(TransportKind kind, ShmResolver resolver,
                                   TcpTransportOptions tcp_options, std::string rdma_device)
    : kind_(kind),
      resolver_(std::move(resolver)),
      tcp_(tcp_options),
      rdma_(std::move(rdma_device)),
      copiers_(CopyThreads()) {}

std::shared_ptr<const ShmTransport::Pool> RoutingTransport::LocalPool(const std::string& endpoint,
                                                                      uint64_t incarnation) {
  if (auto pool = shm_.Find(endpoint, incarnation)) return pool;
  {
    absl::MutexLock lock(&mu_);
    auto it = retry_after_.find(endpoint);
    if (it != retry_after_.end() && absl::Now() < it->second) return nullptr;
  }
  // The resolver answers only for segments on this machine.
  std::optional<std::string> socket = resolver_(endpoint);
  if (!socket) return nullptr;
  absl::StatusOr<std::shared_ptr<const ShmTransport::Pool>> pool = shm_.Attach(endpoint, *socket);
  if (pool.ok() && (incarnation == 0 || (*pool)->incarnation == incarnation)) return *pool;
  if (!pool.ok()) {
    KVPOOL_LOG(INFO) << "shared memory with segment " << endpoint
                     << " not available, using TCP: " << pool.status().message();
  }
  absl::MutexLock lock(&mu_);
  retry_after_[endpoint] = absl::Now() + kRetryAttachAfter;
  return nullptr;
}

bool RoutingTransport::HashesWrite(const TransferOp& op) {
  return !UsesRdma() && PoolFor(op) == nullptr;
}

void RoutingTransport::Execute(absl::Span<TransferOp> ops, absl::Time deadline) {
  const bool rdma = UsesRdma();
  std::vector<std::pair<TransferOp*, std::shared_ptr<const ShmTransport::Pool>>> shm_ops;
  std::vector<TransferOp*> rdma_ops;
  std::vector<size_t> tcp_index;
  for (size_t i = 0; i < ops.size(); ++i) {
    if (ops[i].opcode == wire::Opcode::kReadKey) {
      tcp_index.push_back(i);  // a segment answers reads by key on its data port only
    } else if (auto pool = PoolFor(ops[i])) {
      shm_ops.emplace_back(&ops[i], std::move(pool));
    } else if (rdma) {
      rdma_ops.push_back(&ops[i]);
    } else {
      tcp_index.push_back(i);
    }
  }
  if (shm_ops.empty() && rdma_ops.empty()) {
    tcp_ops_.fetch_add(ops.size(), std::memory_order_relaxed);
    tcp_.Execute(ops, deadline);
    return;
  }
  // TCP ops run on a thread of mixed_ while this one copies through shared memory and posts
  // RDMA requests; what RDMA could not do goes over TCP afterwards.
  auto run_tcp = [this, &ops, deadline](const std::vector<size_t>& index) {
    std::vector<TransferOp> batch;
    batch.reserve(index.size());
    for (size_t i : index) batch.push_back(std::move(ops[i]));
    tcp_.Execute(absl::MakeSpan(batch), deadline);
    for (size_t k = 0; k < index.size(); ++k) ops[index[k]] = std::move(batch[k]);
    tcp_ops_.fetch_add(index.size(), std::memory_order_relaxed);
  };
  std::vector<size_t> fallback;
  auto run_local = [&] {
    for (TransferOp* op : CopyShared(shm_ops)) {
      fallback.push_back(static_cast<size_t>(op - ops.data()));
    }
    shm_ops_.fetch_add(shm_ops.size() - fallback.size(), std::memory_order_relaxed);
    if (!rdma_ops.empty()) {
      rdma_.Execute(rdma_ops, deadline);
      for (TransferOp* op : rdma_ops) {
        if (op->status.ok()) {
          rdma_ops_.fetch_add(1, std::memory_order_relaxed);
        } else {
          fallback.push_back(static_cast<size_t>(op - ops.data()));
        }
      }
    }
  };
  if (tcp_index.empty()) {
    run_local();
  } else {
    mixed_.Run({run_local, [&] { run_tcp(tcp_index); }});
  }
  if (!fallback.empty()) run_tcp(fallback);
}

std::vector<TransferOp*> RoutingTransport::CopyShared(
    absl::Span<const std::pair<TransferOp*, std::shared_ptr<const ShmTransport::Pool>>> shm_ops) {
  std::vector<TransferOp*> failed_over;
  absl::Time now = absl::Now();
  // Writes by pool, each fenced by a write intent; reads are copied at once.
  std::vector<std::pair<const ShmTransport::Pool*, std::vector<TransferOp*>>> writes;
  std::vector<std::pair<const ShmTransport::Pool*, TransferOp*>> reads;
  for (const auto& [op, pool] : shm_ops) {
    if (op->opcode != wire::Opcode::kWrite) {
      reads.emplace_back(pool.get(), op);
      continue;
    }
    auto it = std::find_if(writes.begin(), writes.end(),
                           [&](const auto& entry) { return entry.first == pool.get(); });
    if (it == writes.end()) it = writes.insert(writes.end(), {pool.get(), {}});
    it->second.push_back(op);
  }
  CopyAll(reads, now);
  for (auto& [pool, pool_ops] : writes) {
    std::vector<wire::ShmIntent> intents;
    intents.reserve(pool_ops.size());
    for (const TransferOp* op : pool_ops) {
      intents.push_back(wire::ShmIntent{op->offset, op->length, op->token});
    }
    // Step P2 over shared memory: the segment accepts each write (it checks the grant as for
    // a TCP write) before a byte is copied, and is told once they are.
    absl::StatusOr<std::vector<absl::StatusOr<uint64_t>>> begun =
        ShmTransport::BeginWrites(*pool, intents);
    if (!begun.ok()) {
      // The connection broke (nothing was copied, no intent stays open): map afresh next
      // time, and write these over TCP now.
      KVPOOL_LOG(INFO) << "shared memory with segment " << pool_ops[0]->endpoint
                       << " lost its connection, using TCP: " << begun.status().message();
      shm_.Forget(pool_ops[0]->endpoint, pool);
      failed_over.insert(failed_over.end(), pool_ops.begin(), pool_ops.end());
      continue;
    }
    std::vector<uint64_t> done;
    std::vector<std::pair<const ShmTransport::Pool*, TransferOp*>> accepted;
    done.reserve(pool_ops.size());
    for (size_t k = 0; k < pool_ops.size(); ++k) {
      if (!(*begun)[k].ok()) {
        pool_ops[k]->status = (*begun)[k].status();
        continue;
      }
      accepted.emplace_back(pool, pool_ops[k]);
      done.push_back(*(*begun)[k]);
    }
    CopyAll(accepted, now);
    if (!done.empty()) {
      if (absl::Status ended = ShmTransport::EndWrites(*pool, done); !ended.ok()) {
        shm_.Forget(pool_ops[0]->endpoint, pool);  // its close ended the intents all the same
      }
    }
  }
  return failed_over;
}

void RoutingTransport::CopyAll(
    absl::Span<const std::pair<const ShmTransport::Pool*, TransferOp*>> ops, absl::Time now) {
  uint64_t total = 0;
  for (const auto& [pool, op] : ops) total += op->length;
  size_t tasks = total < kParallelCopyBytes ? 1 : std::min<size_t>(copiers_.size() + 1, ops.size());
  if (tasks <= 1) {
    for (const auto& [pool, op] : ops) ShmTransport::Copy(*pool, *op, now);
    return;
  }
  // Runs of consecutive ops of about equal bytes, one per task.
  std::vector<std::function<void()>> work;
  size_t begin = 0;
  uint64_t done = 0;
  for (size_t t = 0; t < tasks && begin < ops.size(); ++t) {
    uint64_t target = total * (t + 1) / tasks;
    size_t end = begin;
    while (end < ops.size() && (end == begin || done < target)) done += ops[end++].second->length;
    if (t + 1 == tasks) end = ops.size();
    work.push_back([ops, begin, end, now] {
      for (size_t k = begin; k < end; ++k) ShmTransport::Copy(*ops[k].first, *ops[k].second, now);
    });
    begin = end;
  }
  copiers_.Run(std::move(work));
}

std::vector<absl::StatusOr<uint64_t>> RoutingTransport::BeginLocalWrites(
    const std::string& endpoint, const std::shared_ptr<const ShmTransport::Pool>& pool,
    absl::Span<const wire::ShmIntent> intents) {
  absl::StatusOr<std::vector<absl::StatusOr<uint64_t>>> begun =
      ShmTransport::BeginWrites(*pool, intents);
  if (begun.ok()) return *std::move(begun);
  shm_.Forget(endpoint, pool.get());
  return std::vector<absl::StatusOr<uint64_t>>(intents.size(), begun.status());
}

void RoutingTransport::EndLocalWrites(const std::string& endpoint, absl::Span<const uint64_t> ids) {
  if (ids.empty()) return;
  std::shared_ptr<const ShmTransport::Pool> pool = shm_.Find(endpoint, 0);
  if (pool == nullptr) return;  // forgotten: its connection closed, ending its intents
  if (!ShmTransport::EndWrites(*pool, ids).ok()) shm_.Forget(endpoint, pool.get());
}

RoutingTransport::Stats RoutingTransport::stats() const {
  return Stats{shm_ops_.load(), rdma_ops_.load(), tcp_ops_.load()};
}

}  // namespace kvpool::client
