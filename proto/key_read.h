#pragma once

// Reads by key (READ_KEY, docs/protocol.md): a key's first get without asking the master.
//
// A segment knows the committed objects it holds (its manifest, kept in step by the master:
// a commit is acknowledged, and a removed or evicted range reused, only once the segment has
// applied the record). So a client may ask the segment for a key directly, under a key-read
// credential the master mints for the client's tenant with that segment's secret (handed out
// with the segment list, ListSegments). The segment looks the key up in the tenant's namespace
// and answers the value with its writer's checksum, which the client always verifies.
//
// Which segment to ask: every object's first replica is placed on the key's home segment
// when it has room (the master tries it first among equally preferred segments), the one
// with the highest HomeScore among the active segments. A client computes the same over its
// segment list; a key placed elsewhere (the home was full, a preference, a list out of date)
// is answered OBJECT_NOT_FOUND and read through the master.
//
// Credential layout (wire::kTokenSize = 32 bytes): u64 expiry (Unix ms), u64 zero, then the
// first 16 bytes of HMAC-SHA256(secret, "kvpool-keyread-v1" | expiry | tenant).

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "proto/capability.h"
#include "proto/frame.h"

namespace kvpool::wire {

// Tenants' key namespaces: tenant "a"'s key "k" is stored as "\x1e" "a" "\x1e" "k"; the
// global namespace (empty tenant) keeps keys as they are.
inline constexpr char kTenantMarker = '\x1e';
std::string TenantKey(absl::string_view tenant, absl::string_view key);

// Longest tenant name and key a READ_KEY may carry.
inline constexpr size_t kMaxKeyReadTenant = 255;
inline constexpr size_t kMaxKeyReadKey = 4096;

Token MintKeyReadCredential(const TokenKey& key, absl::string_view tenant, absl::Time expiry);
// PermissionDenied when the credential was not minted for `tenant` with this secret,
// DeadlineExceeded when it was but expired before `now`.
absl::Status VerifyKeyReadCredential(const TokenKey& key, const Token& credential,
                                     absl::string_view tenant, absl::Time now);

// How strongly `stored_key` belongs on the segment named `segment` of `capacity` bytes: its
// home is the active segment with the highest score. Weighted rendezvous hashing: each
// segment is home to a share of the keys proportional to its capacity, and a segment that
// comes or goes moves only the keys whose home it is.
double HomeScore(absl::string_view stored_key, absl::string_view segment, uint64_t capacity);

}  // namespace kvpool::wire
