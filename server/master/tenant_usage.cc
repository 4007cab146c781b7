#include "server/master/tenant_usage.h"

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/metric_families.h"
#include "common/size.h"
#include "proto/error_codes.h"

namespace kvpool::master {

absl::StatusOr<absl::flat_hash_map<std::string, uint64_t>> ParseTenantQuotas(
    absl::string_view text) {
  absl::flat_hash_map<std::string, uint64_t> quotas;
  for (absl::string_view entry : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    entry = absl::StripAsciiWhitespace(entry);
    std::pair<absl::string_view, absl::string_view> parts = absl::StrSplit(entry, '=');
    absl::StatusOr<uint64_t> bytes = ParseSize(parts.second);
    if (parts.first.empty() || !bytes.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("tenant quota \"", entry, "\" is not TENANT=SIZE (e.g. team-a=10GiB)"));
    }
    if (!quotas.emplace(std::string(parts.first), *bytes).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("tenant \"", parts.first, "\" has two quotas"));
    }
  }
  return quotas;
}

absl::Status TenantUsage::CheckRoom(absl::string_view tenant, uint64_t bytes) const {
  auto quota = quotas_.find(tenant);
  if (quota == quotas_.end()) return absl::OkStatus();
  absl::MutexLock lock(&mu_);
  auto it = used_.find(tenant);
  uint64_t used = it == used_.end() ? 0 : it->second;
  if (bytes <= quota->second && used <= quota->second - bytes) return absl::OkStatus();
  return ErrorStatus(v1::NO_AVAILABLE_HANDLE,
                     absl::StrCat("tenant \"", tenant, "\" is at its quota: ", used, " of ",
                                  quota->second, " bytes held, ", bytes, " more asked"));
}

void TenantUsage::Add(absl::string_view tenant, int64_t delta) {
  absl::MutexLock lock(&mu_);
  uint64_t& used = used_[tenant];
  if (delta >= 0) {
    used += static_cast<uint64_t>(delta);
  } else {
    used -= std::min(used, static_cast<uint64_t>(-delta));
  }
}

uint64_t TenantUsage::Used(absl::string_view tenant) const {
  absl::MutexLock lock(&mu_);
  auto it = used_.find(tenant);
  return it == used_.end() ? 0 : it->second;
}

std::vector<prometheus::MetricFamily> TenantUsage::Collect() const {
  MetricFamilies families;
  absl::MutexLock lock(&mu_);
  for (const auto& [tenant, used] : used_) {
    families.Gauge("kvpool_tenant_used_bytes",
                   "Bytes of the tenant's objects, pending and committed (one copy each; \"\": "
                   "the global namespace).",
                   static_cast<double>(used), {{"tenant", tenant}});
  }
  for (const auto& [tenant, quota] : quotas_) {
    families.Gauge("kvpool_tenant_quota_bytes", "The tenant's byte quota (--tenant-quotas).",
                   static_cast<double>(quota), {{"tenant", tenant}});
  }
  return families.Take();
}

}  // namespace kvpool::master
