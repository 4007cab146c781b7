// libFuzzer target: the capability-token check (proto/capability.h). A request built from
// arbitrary bytes is verified against a fixed secret: it must never pass unless its token is
// the one MintToken gives for exactly that request, and the check never crashes. The same
// token, with the bytes after the header as a tenant, is checked as a key-read credential
// (proto/key_read.h): it must never pass unless minted for exactly that tenant and expiry.

#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "absl/time/time.h"
#include "proto/capability.h"
#include "proto/frame.h"
#include "proto/key_read.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvpool::wire;
  if (size < kRequestHeaderSize) return 0;
  static const std::string secret(kSecretSize, 's');
  absl::StatusOr<RequestHeader> request = DecodeRequest(data);
  if (!request.ok()) return 0;
  absl::Time now = absl::FromUnixSeconds(1'800'000'000);
  absl::Status verdict = VerifyToken(secret, *request, now);
  if (verdict.ok()) {
    // Only a token minted for this very request verifies.
    Token minted = MintToken(secret, request->opcode, request->offset, request->length,
                             TokenExpiry(request->token), TokenGrant(request->token));
    if (std::memcmp(minted.data(), request->token.data(), minted.size()) != 0) std::abort();
  }
  static const TokenKey key(secret);
  absl::string_view tenant(reinterpret_cast<const char*>(data) + kRequestHeaderSize,
                           size - kRequestHeaderSize);
  if (VerifyKeyReadCredential(key, request->token, tenant, now).ok()) {
    Token minted = MintKeyReadCredential(key, tenant, TokenExpiry(request->token));
    if (std::memcmp(minted.data(), request->token.data(), minted.size()) != 0) std::abort();
  }
  return 0;
}
