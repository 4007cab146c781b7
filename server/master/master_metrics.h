#pragma once

// The master's Prometheus metrics: per-RPC counts, failures and latency, per-key result codes
// (so NO_AVAILABLE_HANDLE pressure is visible), and, read from the core at scrape time, the
// state of the pool (segments, capacity, objects, leases, pins, evictions). Recording is a
// few relaxed atomic increments. Thread-safe.

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/latency_histogram.h"
#include "prometheus/metric_family.h"
#include "server/master/leadership.h"
#include "server/master/master.h"

namespace kvpool::master {

// The RPCs of MasterService, in proto order.
enum class Rpc {
  kMountSegment,
  kRestoreManifest,
  kUnmountSegment,
  kHeartbeat,
  kBatchPutStart,
  kBatchPutEnd,
  kBatchPutRevoke,
  kBatchGetReplicaList,
  kBatchExist,
  kBatchRemove,
  kRemoveAll,
  kDrainSegment,
  kMigrateStart,
  kMigrateEnd,
  kGetClusterStatus,
  kBatchDropReplicas,
  kReplicaCopyStart,
  kReplicaCopyEnd,
  kListSegments,
  kCount,
};

const char* RpcName(Rpc rpc);

class MasterMetrics {
 public:
  explicit MasterMetrics(const Master& master) : master_(master) {}

  // With --etcd: report leadership, term and fail-overs from `leadership` (which must outlive
  // this); without, the master is always the leader at term 0. Call before serving.
  void SetLeadership(const Leadership* leadership) { leadership_ = leadership; }

  // One finished call: `ok` is its gRPC status (per-key failures do not count here).
  void RecordCall(Rpc rpc, bool ok, absl::Duration elapsed);
  // The per-key result codes of one batch call.
  void RecordKeyCodes(Rpc rpc, absl::Span<const int32_t> codes) ABSL_LOCKS_EXCLUDED(mu_);
  // How many keys of `rpc` answered `code` so far.
  uint64_t KeyResults(Rpc rpc, int32_t code) const ABSL_LOCKS_EXCLUDED(mu_);

  std::vector<prometheus::MetricFamily> Collect() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct PerRpc {
    std::atomic<uint64_t> requests{0};
    std::atomic<uint64_t> failures{0};
    LatencyHistogram latency;
  };

  const Master& master_;
  const Leadership* leadership_ = nullptr;
  std::array<PerRpc, static_cast<size_t>(Rpc::kCount)> rpcs_;
  mutable absl::Mutex mu_;
  // (rpc, code) -> keys; entries are created once and never removed.
  absl::flat_hash_map<std::pair<int, int32_t>, std::unique_ptr<std::atomic<uint64_t>>> key_codes_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace kvpool::master
