// Bad input against real processes: each gets a clear error, nothing is lost or corrupted,
// and the servers keep serving everyone else.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "gtest/gtest.h"
#include "kvpool/client.h"
#include "kvpool/v1/master.grpc.pb.h"
#include "common/net.h"
#include "proto/channel.h"
#include "proto/error_codes.h"
#include "proto/frame.h"
#include "tests/harness/cluster.h"
#include "tests/harness/raw_tcp.h"

namespace kvpool {
namespace {

class BadInputTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<testing::MasterProcess> master =
        testing::StartMaster({"--embedded-segment-size=0"});
    ASSERT_TRUE(master.ok()) << master.status();
    master_ = std::move(*master);
    absl::StatusOr<testing::SegmentProcess> segment = testing::StartSegment(master_.grpc, "16MiB");
    ASSERT_TRUE(segment.ok()) << segment.status();
    segment_ = std::move(*segment);
    ClientOptions options;
    options.master_address = master_.grpc;
    client_ = std::move(Client::Create(options).value());
    stub_ = v1::MasterService::NewStub(MakeMasterChannel(master_.grpc));
    ASSERT_TRUE(client_->Put("canary", "still here").ok());
  }

  void TearDown() override {
    // Whatever the test did, the pool still serves reads and writes.
    EXPECT_EQ(client_->Get("canary").value_or("<lost>"), "still here");
    EXPECT_TRUE(client_->Put("after-" + std::string(::testing::UnitTest::GetInstance()
                                                         ->current_test_info()
                                                         ->name()),
                             "ok")
                    .ok());
  }

  int ConnectToSegment() {
    int fd = testing::ConnectRawTcp(segment_.data, absl::Seconds(5));
    EXPECT_GE(fd, 0) << "cannot connect to " << segment_.data;
    return fd;
  }

  // Sends a request header and returns the segment's status and reason.
  std::pair<int32_t, std::string> Exchange(const wire::RequestHeader& header) {
    int fd = ConnectToSegment();
    uint8_t bytes[wire::kRequestHeaderSize];
    wire::EncodeRequest(header, bytes);
    EXPECT_EQ(send(fd, bytes, sizeof(bytes), MSG_NOSIGNAL), static_cast<ssize_t>(sizeof(bytes)));
    uint8_t response[wire::kResponseHeaderSize];
    EXPECT_EQ(recv(fd, response, sizeof(response), MSG_WAITALL), static_cast<ssize_t>(sizeof(response)));
    wire::ResponseHeader decoded = *wire::DecodeResponse(response);
    std::string reason(decoded.length, '\0');
    recv(fd, reason.data(), reason.size(), MSG_WAITALL);
    char byte;
    EXPECT_EQ(recv(fd, &byte, 1, 0), 0) << "the segment should close after a rejected frame";
    close(fd);
    return {decoded.status, reason};
  }

  testing::MasterProcess master_;
  testing::SegmentProcess segment_;
  std::unique_ptr<Client> client_;
  std::unique_ptr<v1::MasterService::Stub> stub_;
};

TEST_F(BadInputTest, EmptyAndOversizedKeysAreInvalidKey) {
  const std::string huge(10 << 10, 'k');
  for (const std::string& key : {std::string(), huge}) {
    EXPECT_EQ(ToErrorCode(client_->Put(key, "v")), v1::INVALID_KEY);
    EXPECT_EQ(ToErrorCode(client_->Get(key).status()), v1::INVALID_KEY);
    EXPECT_EQ(ToErrorCode(client_->Exists(key).status()), v1::INVALID_KEY);
    EXPECT_EQ(ToErrorCode(client_->Remove(key)), v1::INVALID_KEY);
  }
  absl::Status status = client_->Put(huge, "v");
  EXPECT_NE(status.message().find("longer than"), absl::string_view::npos) << status;
}

TEST_F(BadInputTest, SizeZeroOrLargerThanThePoolIsInvalidParams) {
  EXPECT_EQ(ToErrorCode(client_->Put("empty", "")), v1::INVALID_PARAMS);
  v1::BatchPutStartRequest request;
  request.add_keys("too-big");
  request.add_sizes(1ull << 40);
  request.add_keys("fits");
  request.add_sizes(100);
  v1::BatchPutStartResponse response;
  grpc::ClientContext context;
  ASSERT_TRUE(stub_->BatchPutStart(&context, request, &response).ok());
  EXPECT_EQ(response.results(0).code(), v1::INVALID_PARAMS);
  EXPECT_NE(response.results(0).message().find("larger than any segment"), std::string::npos);
  EXPECT_EQ(response.results(1).code(), v1::OK);  // the rest of the batch proceeds
}

TEST_F(BadInputTest, MismatchedListLengthsFailTheWholeCall) {
  v1::BatchPutStartRequest request;
  request.add_keys("a");
  request.add_keys("b");
  request.add_sizes(10);
  v1::BatchPutStartResponse response;
  grpc::ClientContext context;
  grpc::Status status = stub_->BatchPutStart(&context, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(status.error_message().find("2 keys but 1 sizes"), std::string::npos);
  EXPECT_EQ(client_->GetClusterStatus()->pending_objects, 0u);
}

TEST_F(BadInputTest, FrameOutsideThePoolIsRejectedWithAReason) {
  auto [status, reason] = Exchange({.opcode = wire::Opcode::kWrite,
                                    .request_id = 1,
                                    .offset = 16 << 20,
                                    .length = 4096});
  EXPECT_EQ(status, v1::INVALID_WRITE);
  EXPECT_NE(reason.find("outside the pool"), std::string::npos) << reason;
}

TEST_F(BadInputTest, FrameWithoutAGrantIsPermissionDenied) {
  // Inside the pool, but the master never granted it: it might hold someone's object.
  auto [status, reason] =
      Exchange({.opcode = wire::Opcode::kWrite, .request_id = 1, .offset = 0, .length = 64});
  EXPECT_EQ(status, v1::PERMISSION_DENIED);
  EXPECT_NE(reason.find("token"), std::string::npos) << reason;
}

TEST_F(BadInputTest, TruncatedHeaderAndGarbageLeaveTheSegmentServing) {
  int fd = ConnectToSegment();
  uint8_t bytes[wire::kRequestHeaderSize];
  wire::EncodeRequest({.opcode = wire::Opcode::kRead, .request_id = 1, .length = 8}, bytes);
  ASSERT_EQ(send(fd, bytes, 13, MSG_NOSIGNAL), 13);
  close(fd);

  fd = ConnectToSegment();
  std::string garbage = "GET / HTTP/1.1\r\nHost: x\r\n\r\n" + std::string(64, 'z');
  ASSERT_EQ(send(fd, garbage.data(), garbage.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(garbage.size()));
  uint8_t response[wire::kResponseHeaderSize];
  ASSERT_EQ(recv(fd, response, sizeof(response), MSG_WAITALL), static_cast<ssize_t>(sizeof(response)));
  EXPECT_EQ(wire::DecodeResponse(response)->status, v1::INVALID_PARAMS);
  close(fd);
}

TEST_F(BadInputTest, ClientVanishingMidPutLeavesNothingVisible) {
  v1::BatchPutStartRequest request;
  request.add_keys("half-written");
  request.add_sizes(1 << 20);
  v1::BatchPutStartResponse response;
  grpc::ClientContext context;
  ASSERT_TRUE(stub_->BatchPutStart(&context, request, &response).ok());
  const v1::Placement& placement = response.results(0).placements(0);
  int fd = ConnectToSegment();
  wire::RequestHeader header{.opcode = wire::Opcode::kWrite,
                             .request_id = 1,
                             .offset = placement.offset(),
                             .length = placement.length()};
  std::memcpy(header.token.data(), placement.token().data(), header.token.size());
  uint8_t bytes[wire::kRequestHeaderSize];
  wire::EncodeRequest(header, bytes);
  std::string half(512 << 10, 'h');
  ASSERT_EQ(send(fd, bytes, sizeof(bytes), MSG_NOSIGNAL), static_cast<ssize_t>(sizeof(bytes)));
  ASSERT_EQ(send(fd, half.data(), half.size(), MSG_NOSIGNAL), static_cast<ssize_t>(half.size()));
  close(fd);  // gone mid-payload, never calls BatchPutEnd

  EXPECT_FALSE(*client_->Exists("half-written"));
  EXPECT_EQ(ToErrorCode(client_->Get("half-written").status()), v1::OBJECT_NOT_FOUND);
}

}  // namespace
}  // namespace kvpool
