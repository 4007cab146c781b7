#include "proto/capability.h"

#include <openssl/crypto.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <cstring>

#include "common/log.h"

namespace kvpool::wire {
namespace {

constexpr char kDomain[] = "kvpool-cap-v2";
constexpr size_t kMacAt = 2 * sizeof(uint64_t);
constexpr size_t kMacSize = kTokenSize - kMacAt;

void ComputeMac(const std::string& secret, Opcode opcode, uint64_t offset, uint64_t length,
                uint64_t expiry_ms, uint64_t grant, uint8_t mac[kMacSize]) {
  uint8_t message[sizeof(kDomain) + 1 + 4 * sizeof(uint64_t)];
  size_t at = 0;
  std::memcpy(message, kDomain, sizeof(kDomain));
  at += sizeof(kDomain);
  message[at++] = static_cast<uint8_t>(opcode);
  for (uint64_t value : {offset, length, expiry_ms, grant}) {
    std::memcpy(message + at, &value, sizeof(value));
    at += sizeof(value);
  }
  uint8_t digest[EVP_MAX_MD_SIZE];
  unsigned int digest_size = 0;
  KVPOOL_CHECK(HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()), message, at,
                    digest, &digest_size) != nullptr);
  std::memcpy(mac, digest, kMacSize);
}

}  // namespace

std::string NewCapabilitySecret() {
  std::string secret(kSecretSize, '\0');
  KVPOOL_CHECK(RAND_bytes(reinterpret_cast<uint8_t*>(secret.data()), kSecretSize) == 1)
      << "no randomness for a capability secret";
  return secret;
}

Token MintToken(const std::string& secret, Opcode opcode, uint64_t offset, uint64_t length,
                absl::Time expiry, uint64_t grant) {
  Token token{};
  uint64_t expiry_ms = static_cast<uint64_t>(absl::ToUnixMillis(expiry));
  std::memcpy(token.data(), &expiry_ms, sizeof(expiry_ms));
  std::memcpy(token.data() + sizeof(expiry_ms), &grant, sizeof(grant));
  ComputeMac(secret, opcode, offset, length, expiry_ms, grant, token.data() + kMacAt);
  return token;
}

uint64_t TokenGrant(const Token& token) {
  uint64_t grant;
  std::memcpy(&grant, token.data() + sizeof(uint64_t), sizeof(grant));
  return grant;
}

absl::Time TokenExpiry(const Token& token) {
  uint64_t expiry_ms;
  std::memcpy(&expiry_ms, token.data(), sizeof(expiry_ms));
  return absl::FromUnixMillis(static_cast<int64_t>(expiry_ms));
}

absl::Status VerifyToken(const std::string& secret, const RequestHeader& request, absl::Time now) {
  uint64_t expiry_ms;
  std::memcpy(&expiry_ms, request.token.data(), sizeof(expiry_ms));
  uint8_t expected[kMacSize];
  ComputeMac(secret, request.opcode, request.offset, request.length, expiry_ms,
             TokenGrant(request.token), expected);
  if (CRYPTO_memcmp(expected, request.token.data() + kMacAt, kMacSize) != 0) {
    return absl::PermissionDeniedError("capability token does not grant this range");
  }
  if (static_cast<int64_t>(expiry_ms) < absl::ToUnixMillis(now)) {
    return absl::DeadlineExceededError("capability token expired");
  }
  return absl::OkStatus();
}

}  // namespace kvpool::wire
