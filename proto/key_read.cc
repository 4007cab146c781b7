#include "proto/key_read.h"

#include <openssl/crypto.h>

#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "proto/checksum.h"

namespace kvpool::wire {
namespace {

constexpr char kDomain[] = "kvpool-keyread-v1";  // with its terminating zero
constexpr size_t kMacAt = 2 * sizeof(uint64_t);
constexpr size_t kMacSize = kTokenSize - kMacAt;

void ComputeMac(const TokenKey& key, uint64_t expiry_ms, absl::string_view tenant,
                uint8_t mac[kMacSize]) {
  std::string message(kDomain, sizeof(kDomain));
  message.append(reinterpret_cast<const char*>(&expiry_ms), sizeof(expiry_ms));
  message.append(tenant.data(), tenant.size());
  uint8_t digest[32];
  key.Sign(reinterpret_cast<const uint8_t*>(message.data()), message.size(), digest);
  std::memcpy(mac, digest, kMacSize);
}

}  // namespace

std::string TenantKey(absl::string_view tenant, absl::string_view key) {
  if (tenant.empty()) return std::string(key);
  return absl::StrCat(absl::string_view(&kTenantMarker, 1), tenant,
                      absl::string_view(&kTenantMarker, 1), key);
}

Token MintKeyReadCredential(const TokenKey& key, absl::string_view tenant, absl::Time expiry) {
  Token credential{};
  uint64_t expiry_ms = static_cast<uint64_t>(absl::ToUnixMillis(expiry));
  std::memcpy(credential.data(), &expiry_ms, sizeof(expiry_ms));
  ComputeMac(key, expiry_ms, tenant, credential.data() + kMacAt);
  return credential;
}

absl::Status VerifyKeyReadCredential(const TokenKey& key, const Token& credential,
                                     absl::string_view tenant, absl::Time now) {
  uint64_t expiry_ms;
  std::memcpy(&expiry_ms, credential.data(), sizeof(expiry_ms));
  uint8_t expected[kMacSize];
  ComputeMac(key, expiry_ms, tenant, expected);
  uint64_t zero;
  std::memcpy(&zero, credential.data() + sizeof(expiry_ms), sizeof(zero));
  if (zero != 0 || CRYPTO_memcmp(expected, credential.data() + kMacAt, kMacSize) != 0) {
    return absl::PermissionDeniedError(
        "key-read credential was not issued for this tenant by this segment's master");
  }
  if (static_cast<int64_t>(expiry_ms) < absl::ToUnixMillis(now)) {
    return absl::DeadlineExceededError("key-read credential expired");
  }
  return absl::OkStatus();
}

double HomeScore(absl::string_view stored_key, absl::string_view segment, uint64_t capacity) {
  std::string both = absl::StrCat(stored_key, absl::string_view("\0", 1), segment);
  iovec part{both.data(), both.size()};
  // A uniform draw in (0, 1) from the hash's top 53 bits; -capacity / ln(u) is the largest
  // with a probability proportional to capacity.
  double u = (static_cast<double>(Checksum(absl::MakeConstSpan(&part, 1)) >> 11) + 0.5) * 0x1p-53;
  return static_cast<double>(capacity) / -std::log(u);
}

}  // namespace kvpool::wire
