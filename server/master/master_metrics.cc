#include "server/master/master_metrics.h"

#include "common/metric_families.h"
#include "proto/error_codes.h"

namespace kvpool::master {

const char* RpcName(Rpc rpc) {
  static constexpr const char* kNames[] = {
      "MountSegment", "RestoreManifest",     "UnmountSegment", "Heartbeat",   "BatchPutStart",
      "BatchPutEnd",  "BatchPutRevoke",      "BatchGetReplicaList", "BatchExist", "BatchRemove",
      "RemoveAll",    "DrainSegment",        "MigrateStart",   "MigrateEnd",  "GetClusterStatus",
      "BatchDropReplicas", "ReplicaCopyStart", "ReplicaCopyEnd",
      "ListSegments"};
  static_assert(sizeof(kNames) / sizeof(kNames[0]) == static_cast<size_t>(Rpc::kCount));
  return kNames[static_cast<size_t>(rpc)];
}

void MasterMetrics::RecordCall(Rpc rpc, bool ok, absl::Duration elapsed) {
  PerRpc& per = rpcs_[static_cast<size_t>(rpc)];
  per.requests.fetch_add(1, std::memory_order_relaxed);
  if (!ok) per.failures.fetch_add(1, std::memory_order_relaxed);
  per.latency.Observe(elapsed);
}

void MasterMetrics::RecordKeyCodes(Rpc rpc, absl::Span<const int32_t> codes) {
  // Count per distinct code first: a batch of hundreds of keys touches the map a few times.
  absl::flat_hash_map<int32_t, uint64_t> counts;
  for (int32_t code : codes) ++counts[code];
  for (const auto& [code, n] : counts) {
    std::pair<int, int32_t> key(static_cast<int>(rpc), code);
    std::atomic<uint64_t>* counter = nullptr;
    {
      absl::ReaderMutexLock lock(&mu_);
      auto it = key_codes_.find(key);
      if (it != key_codes_.end()) counter = it->second.get();
    }
    if (counter == nullptr) {
      absl::MutexLock lock(&mu_);
      auto& slot = key_codes_[key];
      if (!slot) slot = std::make_unique<std::atomic<uint64_t>>(0);
      counter = slot.get();
    }
    counter->fetch_add(n, std::memory_order_relaxed);
  }
}

uint64_t MasterMetrics::KeyResults(Rpc rpc, int32_t code) const {
  absl::ReaderMutexLock lock(&mu_);
  auto it = key_codes_.find(std::make_pair(static_cast<int>(rpc), code));
  return it == key_codes_.end() ? 0 : it->second->load(std::memory_order_relaxed);
}

std::vector<prometheus::MetricFamily> MasterMetrics::Collect() const {
  MetricFamilies families;
  for (size_t i = 0; i < rpcs_.size(); ++i) {
    const PerRpc& per = rpcs_[i];
    MetricLabels method = {{"method", RpcName(static_cast<Rpc>(i))}};
    families.Counter("kvpool_rpc_requests_total", "gRPC calls received, per method.",
                     static_cast<double>(per.requests.load()), method);
    families.Counter("kvpool_rpc_failures_total",
                     "gRPC calls that ended with a non-OK gRPC status (whole-call failures).",
                     static_cast<double>(per.failures.load()), method);
    families.Histogram("kvpool_rpc_duration_seconds", "Time the master took to answer a call.",
                       per.latency.Snapshot(), method);
  }
  {
    absl::ReaderMutexLock lock(&mu_);
    for (const auto& [key, counter] : key_codes_) {
      families.Counter("kvpool_key_results_total",
                       "Per-key results of batch calls by ErrorCode name.",
                       static_cast<double>(counter->load()),
                       {{"method", RpcName(static_cast<Rpc>(key.first))},
                        {"code", ErrorCodeName(key.second)}});
    }
  }

  ClusterSummary summary = master_.GetClusterSummary();
  const MasterCounters& counters = master_.counters();
  {
    etcd::ElectionState election = leadership_ != nullptr
                                       ? leadership_->state()
                                       : etcd::ElectionState{.leader = true};
    families.Gauge("kvpool_master_is_leader",
                   "1 while this master leads (always, without --etcd); 0 on a standby.",
                   election.leader ? 1 : 0);
    families.Gauge("kvpool_master_term",
                   "The leader's term: the etcd revision of its election (0 without --etcd).",
                   static_cast<double>(election.term));
    families.Counter("kvpool_master_elections_total", "Elections this master won.",
                     static_cast<double>(election.elected));
    families.Counter("kvpool_master_failovers_total",
                     "Elections this master won after another master had led (fail-overs).",
                     static_cast<double>(election.takeovers));
    families.Gauge("kvpool_master_failover_seconds",
                   "Of the last fail-over this master won: seconds from when it last saw the "
                   "previous leader's key to its own election.",
                   absl::ToDoubleSeconds(election.last_takeover));
    families.Gauge("kvpool_master_etcd_reachable",
                   "1 when this master's last call to etcd succeeded (1 without --etcd).",
                   election.etcd_error.empty() ? 1 : 0);
  }
  families.Gauge("kvpool_segments_mounted", "Segments mounted on the master now.",
                 static_cast<double>(summary.segments.size()));
  families.Counter("kvpool_segments_dead_total",
                   "Segments declared dead because no heartbeat came within --segment-ttl.",
                   static_cast<double>(counters.segments_expired.load()));
  for (const SegmentSummary& segment : summary.segments) {
    MetricLabels labels = {{"segment", segment.name}};
    families.Gauge("kvpool_segment_capacity_bytes", "Pool size of each mounted segment.",
                   static_cast<double>(segment.capacity_bytes), labels);
    families.Gauge("kvpool_segment_used_bytes",
                   "Bytes of each segment's pool held by objects (committed or reserved).",
                   static_cast<double>(segment.used_bytes), labels);
    families.Gauge("kvpool_segment_busy_bytes",
                   "Bytes of each segment's pool that the segment reports busy with late "
                   "shared-memory writes: placed nowhere until no longer reported.",
                   static_cast<double>(segment.busy_bytes), labels);
  }
  families.Gauge("kvpool_objects", "Committed objects in the index.",
                 static_cast<double>(summary.objects));
  families.Gauge("kvpool_objects_pending",
                 "Objects reserved by BatchPutStart and not yet committed or revoked.",
                 static_cast<double>(summary.pending_objects));
  families.Counter("kvpool_evictions_total", "Objects evicted to make room.",
                   static_cast<double>(counters.evicted_objects.load()));
  families.Counter("kvpool_evicted_bytes_total", "Bytes freed by eviction.",
                   static_cast<double>(counters.evicted_bytes.load()));
  families.Counter("kvpool_reservations_reclaimed_total",
                   "Reservations freed because their writer never committed within --put-timeout.",
                   static_cast<double>(counters.reclaimed_reservations.load()));
  families.Counter("kvpool_commits_refused_total",
                   "Commits a segment refused because the reserved range did not hold the bytes "
                   "of the checksum given (never, partly or wrongly written); logged at most "
                   "once a second.",
                   static_cast<double>(counters.commits_refused.load()));
  families.Gauge("kvpool_leases_active",
                 "Read leases held now (leased objects cannot be evicted or removed).",
                 static_cast<double>(master_.CountLeased()));
  families.Gauge("kvpool_pins_active", "Pins held now, by kind.",
                 static_cast<double>(summary.soft_pinned), {{"kind", "soft"}});
  families.Gauge("kvpool_pins_active", "Pins held now, by kind.",
                 static_cast<double>(summary.hard_pinned), {{"kind", "hard"}});
  return families.Take();
}

}  // namespace kvpool::master
