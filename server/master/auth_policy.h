#pragma once

// Who may call which RPC of MasterService, decided in one place. A caller is an Identity
// (authenticated elsewhere: a client certificate or a bearer token, see credential_table.h)
// with one Role; the policy is a table rpc x role -> rule, and a rule of a segment's own RPCs
// also binds the segment's name to the identity. No sockets: tested as a table
// (auth_policy_test.cc enumerates every method of the service, so an RPC added without a rule
// fails there). Stateless; thread-safe.

#include <optional>
#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/status.h"
#include "server/master/master_metrics.h"

namespace kvpool::master {

enum class Role {
  // put, get, exist, remove: the keys of its own tenant.
  kEngine,
  // mount, heartbeat, restore and unmount: only under its own name.
  kSegment,
  // everything: remove all, drain, migrate, unmount any segment, status; keys of its tenant.
  kAdmin,
  // cluster status only.
  kReader,
  kCount,
};

const char* RoleName(Role role);
// "engine", "segment", "admin", "reader"; nullopt for anything else.
std::optional<Role> ParseRole(absl::string_view name);

// An authenticated caller. `tenant` names the key namespace its keys live in; empty is the
// global namespace (admins, and every caller of a pool without authentication).
struct Identity {
  std::string name;
  Role role = Role::kReader;
  std::string tenant;
};

// What the policy says of one (rpc, role) pair.
enum class Rule {
  kDeny,
  kAllow,
  // Allowed when the segment name the request acts on is the caller's identity name (or,
  // for an identity "PREFIX*", any longer name starting with PREFIX: SegmentNameMatches).
  kOwnSegmentOnly,
};

// The table itself, exposed so a test can print and check it whole.
Rule RuleFor(Rpc rpc, Role role);

// Why a call was refused, for the metrics' "reason" label.
enum class Refusal {
  kNone,
  kNoCredentials,     // UNAUTHENTICATED: neither a token nor a client certificate
  kUnknownToken,      // UNAUTHENTICATED: a token not in the table
  kUnknownCertificate,  // UNAUTHENTICATED: a verified certificate whose name is in no rule
  kWrongRole,         // PERMISSION_DENIED: the role may not call this RPC
  kOtherSegment,      // PERMISSION_DENIED: a segment acting under another segment's name
  kCount,
};
const char* RefusalName(Refusal refusal);

// Whether a segment identity may act as segment `segment`: the same name, or, for an identity
// that ends in '*' (a credentials-file rule shared by several segments, e.g. one token for a
// Kubernetes DaemonSet), any name that starts with what comes before the '*' and is longer.
bool SegmentNameMatches(absl::string_view identity, absl::string_view segment);

// OK, or PermissionDenied with a message naming the caller, its role and the RPC. `segment`
// is the segment name the request acts on (MountSegment, Heartbeat, RestoreManifest,
// UnmountSegment), empty for other RPCs. `refusal` (optional) gets the reason.
absl::Status Authorize(Rpc rpc, const Identity& caller, absl::string_view segment,
                       Refusal* refusal = nullptr);

}  // namespace kvpool::master
