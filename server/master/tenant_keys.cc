#include "server/master/tenant_keys.h"

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace kvpool::master {

absl::string_view TenantOfKey(absl::string_view stored_key) {
  if (stored_key.empty() || stored_key[0] != kTenantMarker) return {};
  size_t end = stored_key.find(kTenantMarker, 1);
  if (end == absl::string_view::npos) return {};
  return stored_key.substr(1, end - 1);
}

absl::Status ScopeKeys(const Identity& caller, std::vector<std::string>& keys) {
  if (caller.tenant.empty()) {
    if (caller.role == Role::kAdmin) return absl::OkStatus();
    for (const std::string& key : keys) {
      if (!key.empty() && key[0] == kTenantMarker) {
        return absl::InvalidArgumentError(absl::StrCat(
            "key \"", absl::CEscape(key),
            "\" begins with byte 0x1e, which marks tenants' namespaces; only an admin may "
            "send such keys"));
      }
    }
    return absl::OkStatus();
  }
  for (std::string& key : keys) key = TenantKey(caller.tenant, key);
  return absl::OkStatus();
}

}  // namespace kvpool::master
