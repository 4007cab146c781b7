#include "proto/error_codes.h"

#include "gtest/gtest.h"

namespace kvpool {
namespace {

TEST(ErrorCodesTest, EveryWireCodeRoundTripsThroughStatus) {
  for (int i = v1::ErrorCode_MIN; i <= v1::ErrorCode_MAX; ++i) {
    if (!v1::ErrorCode_IsValid(i)) continue;
    absl::Status status = FromErrorCode(i, "why");
    EXPECT_EQ(ToErrorCode(status), i) << ErrorCodeName(i);
    EXPECT_EQ(status.ok(), i == 0);
  }
}

TEST(ErrorCodesTest, CanonicalStatusesMapToMooncakeNumbers) {
  EXPECT_EQ(ToErrorCode(absl::OkStatus()), 0);
  EXPECT_EQ(ToErrorCode(absl::NotFoundError("x")), -704);
  EXPECT_EQ(ToErrorCode(absl::AlreadyExistsError("x")), -705);
  EXPECT_EQ(ToErrorCode(absl::ResourceExhaustedError("x")), -200);
  EXPECT_EQ(ToErrorCode(absl::InvalidArgumentError("x")), -600);
  EXPECT_EQ(ToErrorCode(absl::DataLossError("x")), -801);
  EXPECT_EQ(ToErrorCode(absl::UnavailableError("x")), -900);
}

TEST(ErrorCodesTest, SpecificCodesKeepTheirNumberBehindAGenericCanonicalCode) {
  absl::Status transfer = ErrorStatus(v1::TRANSFER_FAIL, "connection reset");
  EXPECT_EQ(transfer.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(ToErrorCode(transfer), -800);
  EXPECT_EQ(transfer.message(), "connection reset");
  EXPECT_EQ(ToErrorCode(ErrorStatus(v1::INVALID_KEY, "")), -400);
  EXPECT_EQ(ErrorStatus(v1::INVALID_KEY, "").message(), "INVALID_KEY");
}

TEST(ErrorCodesTest, NamesAndUnknownNumbers) {
  EXPECT_EQ(ErrorCodeName(-200), "NO_AVAILABLE_HANDLE");
  EXPECT_EQ(ErrorCodeName(-12345), "UNKNOWN(-12345)");
  absl::Status unknown = FromErrorCode(-12345, "odd");
  EXPECT_EQ(unknown.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(ToErrorCode(unknown), -12345);
}

TEST(ErrorCodesTest, GrpcFailuresBecomeRpcFail) {
  absl::Status down = FromGrpcStatus(grpc::Status(grpc::StatusCode::UNAVAILABLE, "down"));
  EXPECT_EQ(down.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(ToErrorCode(down), -900);
  absl::Status late = FromGrpcStatus(grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "late"));
  EXPECT_EQ(late.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(ToErrorCode(late), -900);
  absl::Status bad = FromGrpcStatus(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "bad"));
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ToGrpcStatus(absl::NotFoundError("gone")).error_code(), grpc::StatusCode::NOT_FOUND);
  // A specific code survives the trip through gRPC.
  absl::Status sent = FromGrpcStatus(ToGrpcStatus(ErrorStatus(v1::SEGMENT_NOT_FOUND, "no seg")));
  EXPECT_EQ(sent.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(ToErrorCode(sent), v1::SEGMENT_NOT_FOUND);
  EXPECT_EQ(sent.message(), "no seg");
}

}  // namespace
}  // namespace kvpool
