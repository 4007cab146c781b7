#pragma once

// Capability tokens: how a segment knows that the master granted a byte range.
//
// Each segment draws a fresh random secret every time it mounts on a master and hands it to
// that master. For every placement the master mints a token over (opcode, offset, length,
// expiry, grant); the segment recomputes it and serves the range only if it matches and has
// not expired. A client can therefore touch exactly the ranges the master gave it, for the
// time it gave. Because the secret changes with every mount, a token minted by an earlier
// master (or an earlier mount: a master term) fails the check: grants are fenced by term.
//
// The grant id names the reservation (or committed object) the token belongs to: the segment
// refuses a token whose grant the master has since ended (GrantTable), whatever its expiry.
//
// Token layout (wire::kTokenSize = 32 bytes): u64 expiry (Unix ms), u64 grant id (both
// little-endian), then the first 16 bytes of
// HMAC-SHA256(secret, "kvpool-cap-v2" | opcode | offset | length | expiry | grant).

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "proto/frame.h"

namespace kvpool::wire {

inline constexpr size_t kSecretSize = 32;

// A fresh random secret (kSecretSize bytes) from the system's CSPRNG.
std::string NewCapabilitySecret();

// A secret with its HMAC-SHA256 key schedule (the hash states after the padded key) computed
// once: a token then costs two SHA-256 compressions, about 1 us, where OpenSSL 3's one-shot
// HMAC spends 3-9 us setting up each call. Immutable; copies share the schedule; usable from
// any number of threads at once. The master keeps one per mounted segment, the segment one
// per term.
class TokenKey {
 public:
  explicit TokenKey(absl::string_view secret);

  // HMAC-SHA256(secret, message[0, size)) into digest[32].
  void Sign(const uint8_t* message, size_t size, uint8_t* digest) const;

 private:
  struct Schedule;
  std::shared_ptr<const Schedule> schedule_;
};

Token MintToken(const TokenKey& key, Opcode opcode, uint64_t offset, uint64_t length,
                absl::Time expiry, uint64_t grant = 0);
// The same with a key schedule made for this one call (tests, tools).
Token MintToken(const std::string& secret, Opcode opcode, uint64_t offset, uint64_t length,
                absl::Time expiry, uint64_t grant = 0);

// The grant id and expiry a token carries (unauthenticated: verify first).
uint64_t TokenGrant(const Token& token);
absl::Time TokenExpiry(const Token& token);

// PermissionDenied (with the reason) when the token was not minted for exactly this request
// with this secret; DeadlineExceeded when it was, but expired before `now` (a read whose
// lease ran out, a write whose reservation did).
absl::Status VerifyToken(const TokenKey& key, const RequestHeader& request, absl::Time now);
absl::Status VerifyToken(const std::string& secret, const RequestHeader& request, absl::Time now);

}  // namespace kvpool::wire
