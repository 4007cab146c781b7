// The shared-memory and RDMA handshakes round-trip and refuse what is not theirs.

#include <cstring>

#include "gtest/gtest.h"
#include "proto/rdma_handshake.h"
#include "proto/shm_handshake.h"

namespace kvpool::wire {
namespace {

TEST(ShmHandshakeTest, HelloAndAnswerRoundTrip) {
  std::string hello = EncodeShmHello();
  ASSERT_EQ(hello.size(), kShmHelloSize);
  EXPECT_EQ(std::memcmp(hello.data(), "KVSH", 4), 0);
  EXPECT_TRUE(DecodeShmHello(reinterpret_cast<const uint8_t*>(hello.data())).ok());
  hello[4] = 9;
  EXPECT_FALSE(DecodeShmHello(reinterpret_cast<const uint8_t*>(hello.data())).ok());

  std::string answer = EncodeShmAnswer({.status = -1100, .pool_size = 1 << 30,
                                        .incarnation = 77, .reason = "not you"});
  ASSERT_EQ(answer.size(), kShmAnswerSize + 7);
  uint32_t reason_length = 0;
  absl::StatusOr<ShmAnswer> decoded =
      DecodeShmAnswer(reinterpret_cast<const uint8_t*>(answer.data()), &reason_length);
  ASSERT_TRUE(decoded.ok());
  EXPECT_EQ(decoded->status, -1100);
  EXPECT_EQ(decoded->pool_size, 1u << 30);
  EXPECT_EQ(decoded->incarnation, 77u);
  EXPECT_EQ(reason_length, 7u);
}

TEST(RdmaHandshakeTest, ConnectInfoRoundTrips) {
  RdmaConnect connect;
  connect.granted_opcode = Opcode::kWrite;
  connect.info.qp_num = 0x123456;
  connect.info.psn = 0xabcdef;
  connect.info.lid = 7;
  connect.info.gid[15] = 9;
  connect.info.mtu = 5;
  connect.info.addr = 0x7f0000001000;
  connect.info.rkey = 0xdeadbeef;
  uint8_t bytes[kRdmaPayloadSize];
  EncodeRdmaConnect(connect, bytes);
  absl::StatusOr<RdmaConnect> decoded = DecodeRdmaConnect(bytes, /*answer=*/false);
  ASSERT_TRUE(decoded.ok());
  EXPECT_EQ(decoded->granted_opcode, Opcode::kWrite);
  EXPECT_EQ(decoded->info.qp_num, 0x123456u);
  EXPECT_EQ(decoded->info.psn, 0xabcdefu);
  EXPECT_EQ(decoded->info.lid, 7);
  EXPECT_EQ(decoded->info.gid[15], 9);
  EXPECT_EQ(decoded->info.addr, 0x7f0000001000u);
  EXPECT_EQ(decoded->info.rkey, 0xdeadbeefu);
  // A request must name a READ or WRITE grant; an answer names none.
  EXPECT_FALSE(DecodeRdmaConnect(bytes, /*answer=*/true).ok());
  bytes[0] = static_cast<uint8_t>(Opcode::kPing);
  EXPECT_FALSE(DecodeRdmaConnect(bytes, /*answer=*/false).ok());
}

}  // namespace
}  // namespace kvpool::wire
