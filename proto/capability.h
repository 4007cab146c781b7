#pragma once

// Capability tokens: how a segment knows that the master granted a byte range.
//
// Each segment draws a random secret when it starts and hands it to the master when it
// mounts. For every placement the master mints a token over (opcode, offset, length, expiry);
// the segment recomputes it and serves the range only if it matches and has not expired.
// A client can therefore touch exactly the ranges the master gave it, for the time it gave.
//
// Token layout (wire::kTokenSize = 24 bytes): u64 expiry (Unix ms, little-endian), then the
// first 16 bytes of HMAC-SHA256(secret, "kvpool-cap-v1" | opcode | offset | length | expiry).

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "proto/frame.h"

namespace kvpool::wire {

inline constexpr size_t kSecretSize = 32;

// A fresh random secret (kSecretSize bytes) from the system's CSPRNG.
std::string NewCapabilitySecret();

Token MintToken(const std::string& secret, Opcode opcode, uint64_t offset, uint64_t length,
                absl::Time expiry);

// PermissionDenied (with the reason) when the token was not minted for exactly this request
// with this secret; DeadlineExceeded when it was, but expired before `now` (a read whose
// lease ran out, a write whose reservation did).
absl::Status VerifyToken(const std::string& secret, const RequestHeader& request, absl::Time now);

}  // namespace kvpool::wire
