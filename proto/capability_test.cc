#include "proto/capability.h"

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
