#include "proto/frame.h"

#include <cstring>

#include "gtest/gtest.h"

namespace kvpool::wire {
namespace {

RequestHeader SampleRequest() {
  RequestHeader header;
  header.opcode = Opcode::kWrite;
  header.request_id = 0x0102030405060708;
  header.offset = 1ull << 40;
  header.length = 64ull << 20;
  for (size_t i = 0; i < kTokenSize; ++i) header.token[i] = static_cast<uint8_t>(i * 7);
  return header;
}

TEST(FrameTest, RequestRoundTrips) {
  uint8_t bytes[kRequestHeaderSize];
  EncodeRequest(SampleRequest(), bytes);
  absl::StatusOr<RequestHeader> decoded = DecodeRequest(bytes);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->opcode, Opcode::kWrite);
  EXPECT_EQ(decoded->request_id, 0x0102030405060708u);
  EXPECT_EQ(decoded->offset, 1ull << 40);
  EXPECT_EQ(decoded->length, 64ull << 20);
  EXPECT_EQ(decoded->token, SampleRequest().token);
}

TEST(FrameTest, RequestLayoutIsLittleEndianAtDocumentedOffsets) {
  uint8_t bytes[kRequestHeaderSize];
  EncodeRequest(SampleRequest(), bytes);
  EXPECT_EQ(std::memcmp(bytes, "KVPL", 4), 0);
  EXPECT_EQ(bytes[4], kVersion);
  EXPECT_EQ(bytes[5], 2);
  EXPECT_EQ(bytes[8], 0x08);   // request_id, least significant byte first
  EXPECT_EQ(bytes[15], 0x01);
  EXPECT_EQ(bytes[16 + 5], 0x01);  // offset 1 << 40
  EXPECT_EQ(bytes[32 + 1], 7);     // token
}

TEST(FrameTest, RejectsBadMagicVersionOpcodeFlagsAndReserved) {
  uint8_t good[kRequestHeaderSize];
  EncodeRequest(SampleRequest(), good);
  struct Case {
    size_t at;
    uint8_t value;
    const char* reason;
  };
  for (Case c : {Case{0, 'X', "magic"}, Case{4, 9, "version"}, Case{5, 0, "opcode"},
                 Case{5, 6, "opcode"}, Case{6, 1, "flags"}}) {
    uint8_t bytes[kRequestHeaderSize];
    std::memcpy(bytes, good, sizeof(bytes));
    bytes[c.at] = c.value;
    absl::StatusOr<RequestHeader> decoded = DecodeRequest(bytes);
    ASSERT_FALSE(decoded.ok()) << c.reason;
    EXPECT_EQ(decoded.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(decoded.status().message().find(c.reason), absl::string_view::npos)
        << decoded.status();
  }
}

TEST(FrameTest, ResponseRoundTrips) {
  uint8_t bytes[kResponseHeaderSize];
  EncodeResponse({.status = -701, .request_id = 99, .length = 12}, bytes);
  EXPECT_EQ(std::memcmp(bytes, "KVPR", 4), 0);
  absl::StatusOr<ResponseHeader> decoded = DecodeResponse(bytes);
  ASSERT_TRUE(decoded.ok());
  EXPECT_EQ(decoded->status, -701);
  EXPECT_EQ(decoded->request_id, 99u);
  EXPECT_EQ(decoded->length, 12u);
  EXPECT_EQ(decoded->checksum, 0u);
  bytes[1] = 0;
  EXPECT_FALSE(DecodeResponse(bytes).ok());
}

TEST(FrameTest, ReadKeyCarriesTheTenantLengthInFlagsAndAnswersAChecksum) {
  RequestHeader request = SampleRequest();
  request.opcode = Opcode::kReadKey;
  request.flags = 7;
  uint8_t bytes[kRequestHeaderSize];
  EncodeRequest(request, bytes);
  absl::StatusOr<RequestHeader> decoded = DecodeRequest(bytes);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->opcode, Opcode::kReadKey);
  EXPECT_EQ(decoded->flags, 7);

  uint8_t answer[kResponseHeaderSize];
  EncodeResponse({.status = 0, .request_id = 3, .length = 4096, .checksum = 0x0123456789abcdef},
                 answer);
  EXPECT_EQ(answer[24], 0xef);  // the checksum, least significant byte first
  absl::StatusOr<ResponseHeader> response = DecodeResponse(answer);
  ASSERT_TRUE(response.ok());
  EXPECT_EQ(response->checksum, 0x0123456789abcdefu);
}

}  // namespace
}  // namespace kvpool::wire
