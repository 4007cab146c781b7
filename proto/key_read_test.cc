#include "proto/key_read.h"

#include <set>
#include <string>

#include "gtest/gtest.h"

namespace kvpool::wire {
namespace {

const absl::Time kNow = absl::FromUnixSeconds(1'800'000'000);

TEST(KeyReadTest, CredentialVerifiesForItsTenantAndSecretOnly) {
  TokenKey key(std::string(kSecretSize, 'a'));
  Token credential = MintKeyReadCredential(key, "team-a", kNow + absl::Minutes(1));
  EXPECT_TRUE(VerifyKeyReadCredential(key, credential, "team-a", kNow).ok());
  // Another tenant, the global namespace, another segment's (or term's) secret: refused.
  for (absl::string_view tenant : {"team-b", "", "team-a "}) {
    EXPECT_EQ(VerifyKeyReadCredential(key, credential, tenant, kNow).code(),
              absl::StatusCode::kPermissionDenied)
        << tenant;
  }
  TokenKey other(std::string(kSecretSize, 'b'));
  EXPECT_EQ(VerifyKeyReadCredential(other, credential, "team-a", kNow).code(),
            absl::StatusCode::kPermissionDenied);
  // Any flipped bit, the expiry's or the reserved word's included.
  for (size_t byte = 0; byte < kTokenSize; ++byte) {
    Token forged = credential;
    forged[byte] ^= 0x01;
    EXPECT_FALSE(VerifyKeyReadCredential(key, forged, "team-a", kNow).ok()) << byte;
  }
  EXPECT_EQ(VerifyKeyReadCredential(key, credential, "team-a", kNow + absl::Minutes(2)).code(),
            absl::StatusCode::kDeadlineExceeded);
}

TEST(KeyReadTest, TenantKeysKeepNamespacesApart) {
  EXPECT_EQ(TenantKey("", "k"), "k");
  EXPECT_EQ(TenantKey("a", "k"),
            "\x1e"
            "a\x1e"
            "k");
}

TEST(KeyReadTest, HomesSpreadKeysByCapacityAndMoveFewWhenASegmentComes) {
  std::vector<std::string> segments = {"s0", "s1", "s2", "s3"};
  std::vector<uint64_t> capacity = {1 << 30, 1 << 30, 2u << 30, 1 << 30};
  auto home = [&](const std::string& key, size_t count) {
    size_t best = 0;
    for (size_t s = 1; s < count; ++s) {
      if (HomeScore(key, segments[s], capacity[s]) >
          HomeScore(key, segments[best], capacity[best])) {
        best = s;
      }
    }
    return best;
  };
  std::vector<int> per_segment(4, 0);
  int moved = 0;
  for (int i = 0; i < 5000; ++i) {
    std::string key = "key-" + std::to_string(i);
    EXPECT_EQ(HomeScore(key, "s0", 7), HomeScore(key, "s0", 7));  // the same everywhere
    size_t with_three = home(key, 3);
    size_t with_four = home(key, 4);
    ++per_segment[with_four];
    if (with_four != with_three) {
      EXPECT_EQ(with_four, 3u) << key;  // a key moves only to the segment that came
      ++moved;
    }
  }
  // Shares follow capacity: 1/5, 1/5, 2/5, 1/5.
  EXPECT_NEAR(per_segment[0], 1000, 150);
  EXPECT_NEAR(per_segment[1], 1000, 150);
  EXPECT_NEAR(per_segment[2], 2000, 200);
  EXPECT_NEAR(per_segment[3], 1000, 150);
  EXPECT_NEAR(moved, 1000, 150);
}

}  // namespace
}  // namespace kvpool::wire
