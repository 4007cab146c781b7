#include "proto/capability.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace kvpool::wire {
namespace {

RequestHeader Request(Opcode opcode, uint64_t offset, uint64_t length, const Token& token) {
  RequestHeader header;
  header.opcode = opcode;
  header.offset = offset;
  header.length = length;
  header.token = token;
  return header;
}

TEST(CapabilityTest, GrantsExactlyTheMintedRangeAndOpcode) {
  std::string secret = NewCapabilitySecret();
  ASSERT_EQ(secret.size(), kSecretSize);
  absl::Time now = absl::Now();
  Token token = MintToken(secret, Opcode::kRead, 4096, 512, now + absl::Seconds(10));

  EXPECT_TRUE(VerifyToken(secret, Request(Opcode::kRead, 4096, 512, token), now).ok());
  for (RequestHeader other : {Request(Opcode::kWrite, 4096, 512, token),
                              Request(Opcode::kRead, 4097, 512, token),
                              Request(Opcode::kRead, 4096, 513, token)}) {
    absl::Status status = VerifyToken(secret, other, now);
    EXPECT_EQ(status.code(), absl::StatusCode::kPermissionDenied) << status;
  }
}

TEST(CapabilityTest, TokenKeySignsAsOpenSslsHmacForEveryKeyLength) {
  // Short, block-sized and longer-than-a-block keys (the last are hashed first, RFC 2104).
  for (size_t size : {0, 1, 32, 63, 64, 65, 200}) {
    std::string secret(size, '\0');
    for (size_t i = 0; i < size; ++i) secret[i] = static_cast<char>(i * 7 + 1);
    const uint8_t message[] = "a message of some length, longer than nothing";
    uint8_t expected[EVP_MAX_MD_SIZE];
    unsigned int expected_size = 0;
    ASSERT_NE(HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()), message,
                   sizeof(message), expected, &expected_size),
              nullptr);
    ASSERT_EQ(expected_size, 32u);
    uint8_t got[32];
    TokenKey(secret).Sign(message, sizeof(message), got);
    EXPECT_EQ(std::string(reinterpret_cast<char*>(got), 32),
              std::string(reinterpret_cast<char*>(expected), 32))
        << "key of " << size << " bytes";
  }
}

TEST(CapabilityTest, AKeyScheduleMintsAndVerifiesAsItsSecretFromManyThreads) {
  const std::string secret = NewCapabilitySecret();
  const TokenKey key(secret);
  const absl::Time expiry = absl::Now() + absl::Seconds(10);
  std::vector<std::thread> threads;
  std::vector<int> mismatches(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (uint64_t i = 0; i < 2000; ++i) {
        const uint64_t offset = (i * 4 + t) * 4096;
        Token token = MintToken(key, Opcode::kRead, offset, 4096, expiry, i);
        mismatches[t] += token != MintToken(secret, Opcode::kRead, offset, 4096, expiry, i);
        mismatches[t] += !VerifyToken(key, Request(Opcode::kRead, offset, 4096, token),
                                      absl::Now()).ok();
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(mismatches, std::vector<int>(4, 0));
  Token other = MintToken(TokenKey(NewCapabilitySecret()), Opcode::kRead, 0, 1, expiry);
  EXPECT_EQ(VerifyToken(key, Request(Opcode::kRead, 0, 1, other), absl::Now()).code(),
            absl::StatusCode::kPermissionDenied);
}

TEST(CapabilityTest, RejectsOtherSecretsTamperingAndExpiry) {
  std::string secret = NewCapabilitySecret();
  absl::Time now = absl::Now();
  Token token = MintToken(secret, Opcode::kWrite, 0, 100, now + absl::Seconds(1));
  EXPECT_FALSE(VerifyToken(NewCapabilitySecret(), Request(Opcode::kWrite, 0, 100, token), now).ok());

  Token extended = token;
  extended[3] ^= 0x40;  // push the expiry far into the future without re-signing
  EXPECT_FALSE(VerifyToken(secret, Request(Opcode::kWrite, 0, 100, extended), now).ok());

  absl::Status expired =
      VerifyToken(secret, Request(Opcode::kWrite, 0, 100, token), now + absl::Seconds(2));
  EXPECT_EQ(expired.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(expired.message().find("expired"), absl::string_view::npos);
}

TEST(CapabilityTest, CarriesAndBindsItsGrant) {
  std::string secret = NewCapabilitySecret();
  absl::Time now = absl::Now();
  Token token = MintToken(secret, Opcode::kWrite, 0, 100, now + absl::Seconds(5), 0xfeed);
  EXPECT_EQ(TokenGrant(token), 0xfeedu);
  EXPECT_EQ(absl::ToUnixMillis(TokenExpiry(token)), absl::ToUnixMillis(now + absl::Seconds(5)));
  ASSERT_TRUE(VerifyToken(secret, Request(Opcode::kWrite, 0, 100, token), now).ok());
  Token other = token;
  other[8] ^= 1;  // another grant, not re-signed
  EXPECT_EQ(VerifyToken(secret, Request(Opcode::kWrite, 0, 100, other), now).code(),
            absl::StatusCode::kPermissionDenied);
}

}  // namespace
}  // namespace kvpool::wire
