#include "proto/capability.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/rand.h>

#include <cstring>

#include "common/log.h"

namespace kvpool::wire {
namespace {

constexpr char kDomain[] = "kvpool-cap-v2";
constexpr size_t kMacAt = 2 * sizeof(uint64_t);
constexpr size_t kMacSize = kTokenSize - kMacAt;

constexpr size_t kShaBlock = 64;
constexpr size_t kShaDigest = 32;

struct DigestContext {
  DigestContext() : ctx(EVP_MD_CTX_new()) { KVPOOL_CHECK(ctx != nullptr) << "out of memory"; }
  ~DigestContext() { EVP_MD_CTX_free(ctx); }
  DigestContext(const DigestContext&) = delete;
  DigestContext& operator=(const DigestContext&) = delete;
  EVP_MD_CTX* ctx;
};

}  // namespace

// SHA-256 states after absorbing (key ^ ipad) and (key ^ opad): HMAC's two fixed prefixes
// (RFC 2104; a key longer than a block is hashed first).
struct TokenKey::Schedule {
  DigestContext inner;
  DigestContext outer;
};

TokenKey::TokenKey(absl::string_view secret) {
  auto schedule = std::make_shared<Schedule>();
  uint8_t key[kShaBlock] = {};
  if (secret.size() > kShaBlock) {
    unsigned int size = 0;
    KVPOOL_CHECK(EVP_Digest(secret.data(), secret.size(), key, &size, EVP_sha256(), nullptr) == 1);
  } else {
    std::memcpy(key, secret.data(), secret.size());
  }
  uint8_t pad[kShaBlock];
  for (auto [context, mask] : {std::pair{schedule->inner.ctx, uint8_t{0x36}},
                               std::pair{schedule->outer.ctx, uint8_t{0x5c}}}) {
    for (size_t i = 0; i < kShaBlock; ++i) pad[i] = key[i] ^ mask;
    KVPOOL_CHECK(EVP_DigestInit_ex(context, EVP_sha256(), nullptr) == 1 &&
                 EVP_DigestUpdate(context, pad, kShaBlock) == 1);
  }
  OPENSSL_cleanse(key, sizeof(key));
  OPENSSL_cleanse(pad, sizeof(pad));
  schedule_ = std::move(schedule);
}

// Copies of the two prefixed states, each finished over its input (the schedule itself is only
// read, so threads share it).
void TokenKey::Sign(const uint8_t* message, size_t size, uint8_t* digest) const {
  DigestContext scratch;
  unsigned int digest_size = 0;
  KVPOOL_CHECK(EVP_MD_CTX_copy_ex(scratch.ctx, schedule_->inner.ctx) == 1 &&
               EVP_DigestUpdate(scratch.ctx, message, size) == 1 &&
               EVP_DigestFinal_ex(scratch.ctx, digest, &digest_size) == 1 &&
               EVP_MD_CTX_copy_ex(scratch.ctx, schedule_->outer.ctx) == 1 &&
               EVP_DigestUpdate(scratch.ctx, digest, kShaDigest) == 1 &&
               EVP_DigestFinal_ex(scratch.ctx, digest, &digest_size) == 1);
}

namespace {

void ComputeMac(const TokenKey& key, Opcode opcode, uint64_t offset, uint64_t length,
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
  uint8_t digest[kShaDigest];
  key.Sign(message, at, digest);
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
  return MintToken(TokenKey(secret), opcode, offset, length, expiry, grant);
}

Token MintToken(const TokenKey& key, Opcode opcode, uint64_t offset, uint64_t length,
                absl::Time expiry, uint64_t grant) {
  Token token{};
  uint64_t expiry_ms = static_cast<uint64_t>(absl::ToUnixMillis(expiry));
  std::memcpy(token.data(), &expiry_ms, sizeof(expiry_ms));
  std::memcpy(token.data() + sizeof(expiry_ms), &grant, sizeof(grant));
  ComputeMac(key, opcode, offset, length, expiry_ms, grant, token.data() + kMacAt);
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
  return VerifyToken(TokenKey(secret), request, now);
}

absl::Status VerifyToken(const TokenKey& key, const RequestHeader& request, absl::Time now) {
  uint64_t expiry_ms;
  std::memcpy(&expiry_ms, request.token.data(), sizeof(expiry_ms));
  uint8_t expected[kMacSize];
  ComputeMac(key, request.opcode, request.offset, request.length, expiry_ms,
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
