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

absl::StatusOr<ShmMessageHeader> HeaderOf(const std::string& message) {
  if (message.size() < kShmMessageHeaderSize) return absl::InvalidArgumentError("short");
  return DecodeShmMessageHeader(reinterpret_cast<const uint8_t*>(message.data()));
}

absl::Span<const uint8_t> BodyOf(const std::string& message) {
  return absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(message.data()), message.size())
      .subspan(kShmMessageHeaderSize);
}

TEST(ShmHandshakeTest, IntentsDoneAndRepliesRoundTrip) {
  ShmIntent first{.offset = 4096, .length = 1 << 20};
  first.token[0] = 1;
  first.token[31] = 0xee;
  ShmIntent second{.offset = 1ull << 40, .length = 7};
  std::string intents = EncodeShmIntents({first, second});
  ASSERT_EQ(intents.size(), kShmMessageHeaderSize + 2 * kShmIntentEntrySize);
  EXPECT_EQ(std::memcmp(intents.data(), "KVSI", 4), 0);
  absl::StatusOr<ShmMessageHeader> header = HeaderOf(intents);
  ASSERT_TRUE(header.ok()) << header.status();
  EXPECT_EQ(header->kind, ShmMessageKind::kIntents);
  EXPECT_EQ(header->count, 2u);
  absl::StatusOr<std::vector<ShmIntent>> decoded = DecodeShmIntents(*header, BodyOf(intents));
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  ASSERT_EQ(decoded->size(), 2u);
  EXPECT_EQ((*decoded)[0].offset, 4096u);
  EXPECT_EQ((*decoded)[0].length, 1u << 20);
  EXPECT_EQ((*decoded)[0].token, first.token);
  EXPECT_EQ((*decoded)[1].offset, 1ull << 40);
  EXPECT_EQ((*decoded)[1].length, 7u);
  // A body of another kind or size is refused.
  EXPECT_FALSE(DecodeShmDone(*header, BodyOf(intents)).ok());
  EXPECT_FALSE(DecodeShmIntents(*header, BodyOf(intents).subspan(1)).ok());

  std::vector<uint64_t> ids = {3, 1ull << 63};
  std::string done = EncodeShmDone(ids);
  header = HeaderOf(done);
  ASSERT_TRUE(header.ok());
  EXPECT_EQ(header->kind, ShmMessageKind::kDone);
  EXPECT_EQ(DecodeShmDone(*header, BodyOf(done)).value_or(std::vector<uint64_t>{}), ids);

  std::string replies = EncodeShmReplies({{.status = 0, .intent = 9}, {.status = -1100}});
  header = HeaderOf(replies);
  ASSERT_TRUE(header.ok());
  absl::StatusOr<std::vector<ShmReply>> answered = DecodeShmReplies(*header, BodyOf(replies));
  ASSERT_TRUE(answered.ok());
  ASSERT_EQ(answered->size(), 2u);
  EXPECT_EQ((*answered)[0].intent, 9u);
  EXPECT_EQ((*answered)[1].status, -1100);
  EXPECT_EQ((*answered)[1].intent, 0u);
  replies[kShmMessageHeaderSize + 4] = 1;  // reserved bits of an entry
  EXPECT_FALSE(DecodeShmReplies(*header, BodyOf(replies)).ok());
}

TEST(ShmHandshakeTest, MalformedMessageHeadersAreRefused) {
  std::string message = EncodeShmDone({std::vector<uint64_t>{1}});
  ASSERT_TRUE(HeaderOf(message).ok());
  std::string wrong_magic = message;
  wrong_magic[0] = 'X';
  EXPECT_FALSE(HeaderOf(wrong_magic).ok());
  std::string no_entries = message;
  no_entries[4] = 0;
  EXPECT_FALSE(HeaderOf(no_entries).ok());
  std::string too_many = message;
  uint32_t count = kShmMaxEntries + 1;
  std::memcpy(too_many.data() + 4, &count, sizeof(count));
  EXPECT_FALSE(HeaderOf(too_many).ok());
  std::string reserved = message;
  reserved[12] = 1;
  EXPECT_FALSE(HeaderOf(reserved).ok());
  // Version 1 clients (no intents) are refused at the hello.
  std::string hello = EncodeShmHello();
  hello[4] = 1;
  EXPECT_FALSE(DecodeShmHello(reinterpret_cast<const uint8_t*>(hello.data())).ok());
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
