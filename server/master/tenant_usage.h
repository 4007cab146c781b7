#pragma once

// The bytes each tenant's objects hold, and the byte quotas a put must stay within. Bytes are
// logical: an object's size once, whatever its replica count, from the reservation
// (BatchPutStart) until the object is gone (revoked, reclaimed, removed, evicted, dropped
// with its segments). The index shards report every object they add and erase (Add); the
// master asks CheckRoom before each reservation, so concurrent puts of one tenant may pass
// its quota by at most the reservations in flight at that moment. The master counts only when
// some quota is set. Thread-safe.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "prometheus/metric_family.h"

namespace kvpool::master {

// "team-a=10GiB,team-b=512MiB" -> quotas; InvalidArgument naming the bad entry.
absl::StatusOr<absl::flat_hash_map<std::string, uint64_t>> ParseTenantQuotas(
    absl::string_view text);

class TenantUsage {
 public:
  // Tenants without an entry have no quota ("" is the global namespace).
  explicit TenantUsage(absl::flat_hash_map<std::string, uint64_t> quotas = {})
      : quotas_(std::move(quotas)) {}

  // ResourceExhausted (NO_AVAILABLE_HANDLE) if `bytes` more would take `tenant` past its quota.
  absl::Status CheckRoom(absl::string_view tenant, uint64_t bytes) const ABSL_LOCKS_EXCLUDED(mu_);
  // An object of `tenant` appeared (positive) or went (negative).
  void Add(absl::string_view tenant, int64_t delta) ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t Used(absl::string_view tenant) const ABSL_LOCKS_EXCLUDED(mu_);

  // kvpool_tenant_used_bytes{tenant}, kvpool_tenant_quota_bytes{tenant}.
  std::vector<prometheus::MetricFamily> Collect() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const absl::flat_hash_map<std::string, uint64_t> quotas_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, uint64_t> used_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvpool::master
