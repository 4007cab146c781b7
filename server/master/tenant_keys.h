#pragma once

// Tenants' key namespaces. A caller's keys are stored under its tenant, which comes from its
// identity (credential_table.h), never from the request: tenant "a" sending key "k" reaches
// the object "\x1e" "a" "\x1e" "k", which tenant "b"'s "k" (or any key "b" can send) is not.
// The global namespace (empty tenant) keeps keys as they are; there a key may not begin with
// the marker byte unless the caller is an admin, so no one outside a tenant reaches into it.
// Pure functions; thread-safe.

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "proto/key_read.h"
#include "server/master/auth_policy.h"

namespace kvpool::master {

// The stored key of `key` in `tenant`'s namespace (shared with segments, which look keys up
// for READ_KEY).
using wire::kTenantMarker;
using wire::TenantKey;

// The tenant a stored key belongs to (empty: the global namespace).
absl::string_view TenantOfKey(absl::string_view stored_key);

// Rewrites `keys` in place into the caller's namespace. InvalidArgument (naming the key)
// when a non-admin caller of the global namespace sends a key beginning with the marker.
absl::Status ScopeKeys(const Identity& caller, std::vector<std::string>& keys);

}  // namespace kvpool::master
