#include "proto/error_codes.h"

#include <charconv>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace kvpool {
namespace {

constexpr absl::string_view kCodePayloadUrl = "type.kvpool.dev/error_code";

absl::StatusCode CanonicalFor(int32_t code) {
  switch (code) {
    case v1::OK:
      return absl::StatusCode::kOk;
    case v1::OBJECT_NOT_FOUND:
    case v1::SEGMENT_NOT_FOUND:
    case v1::TASK_NOT_FOUND:
      return absl::StatusCode::kNotFound;
    case v1::OBJECT_ALREADY_EXISTS:
    case v1::SEGMENT_ALREADY_EXISTS:
      return absl::StatusCode::kAlreadyExists;
    case v1::NO_AVAILABLE_HANDLE:
      return absl::StatusCode::kResourceExhausted;
    case v1::INVALID_KEY:
    case v1::INVALID_PARAMS:
    case v1::INVALID_WRITE:
    case v1::INVALID_READ:
    case v1::INVALID_REPLICA:
      return absl::StatusCode::kInvalidArgument;
    case v1::BUFFER_OVERFLOW:
      return absl::StatusCode::kOutOfRange;
    case v1::REPLICA_IS_NOT_READY:
    case v1::OBJECT_HAS_LEASE:
    case v1::UNAVAILABLE_IN_CURRENT_STATUS:
      return absl::StatusCode::kFailedPrecondition;
    case v1::LEASE_EXPIRED:
      return absl::StatusCode::kAborted;
    case v1::TRANSFER_FAIL:
    case v1::RPC_FAIL:
    case v1::WRITE_FAIL:
      return absl::StatusCode::kUnavailable;
    case v1::CHECKSUM_MISMATCH:
      return absl::StatusCode::kDataLoss;
    case v1::PERMISSION_DENIED:
      return absl::StatusCode::kPermissionDenied;
    default:
      return absl::StatusCode::kInternal;
  }
}

int32_t CodeForCanonical(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kOk:
      return v1::OK;
    case absl::StatusCode::kNotFound:
      return v1::OBJECT_NOT_FOUND;
    case absl::StatusCode::kAlreadyExists:
      return v1::OBJECT_ALREADY_EXISTS;
    case absl::StatusCode::kResourceExhausted:
      return v1::NO_AVAILABLE_HANDLE;
    case absl::StatusCode::kInvalidArgument:
      return v1::INVALID_PARAMS;
    case absl::StatusCode::kOutOfRange:
      return v1::BUFFER_OVERFLOW;
    case absl::StatusCode::kFailedPrecondition:
      return v1::OBJECT_HAS_LEASE;
    case absl::StatusCode::kAborted:
      return v1::LEASE_EXPIRED;
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
      return v1::RPC_FAIL;
    case absl::StatusCode::kDataLoss:
      return v1::CHECKSUM_MISMATCH;
    case absl::StatusCode::kPermissionDenied:
    case absl::StatusCode::kUnauthenticated:  // Mooncake's codes have no separate one
      return v1::PERMISSION_DENIED;
    default:
      return v1::INTERNAL_ERROR;
  }
}

}  // namespace

absl::Status ErrorStatus(ErrorCode code, absl::string_view message) {
  return FromErrorCode(code, message);
}

absl::Status WithErrorCode(absl::Status status, ErrorCode code) {
  if (!status.ok()) status.SetPayload(kCodePayloadUrl, absl::Cord(absl::StrCat(int32_t{code})));
  return status;
}

int32_t ToErrorCode(const absl::Status& status) {
  if (status.ok()) return v1::OK;
  if (auto payload = status.GetPayload(kCodePayloadUrl)) {
    std::string text(*payload);
    int32_t code = 0;
    auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), code);
    if (ec == std::errc() && ptr == text.data() + text.size()) return code;
  }
  return CodeForCanonical(status.code());
}

absl::Status FromErrorCode(int32_t code, absl::string_view message) {
  if (code == v1::OK) return absl::OkStatus();
  absl::StatusCode canonical = CanonicalFor(code);
  std::string text = message.empty() ? ErrorCodeName(code) : std::string(message);
  if (canonical == absl::StatusCode::kInternal && !v1::ErrorCode_IsValid(code)) {
    text = absl::StrCat(ErrorCodeName(code), ": ", text);
  }
  return WithErrorCode(absl::Status(canonical, text), static_cast<ErrorCode>(code));
}

std::string ErrorCodeName(int32_t code) {
  if (v1::ErrorCode_IsValid(code)) return v1::ErrorCode_Name(static_cast<v1::ErrorCode>(code));
  return absl::StrCat("UNKNOWN(", code, ")");
}

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  // The numeric code travels in the status details, so the other side gets it back exactly.
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()),
                      absl::StrCat(ToErrorCode(status)));
}

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  auto code = static_cast<absl::StatusCode>(status.error_code());
  int32_t sent_code = 0;
  if (absl::SimpleAtoi(status.error_details(), &sent_code) && sent_code != 0) {
    return WithErrorCode(absl::Status(code, status.error_message()),
                         static_cast<ErrorCode>(sent_code));
  }
  std::string message = absl::StrCat("master RPC failed: ", status.error_message());
  if (code == absl::StatusCode::kUnavailable || code == absl::StatusCode::kDeadlineExceeded ||
      code == absl::StatusCode::kCancelled || code == absl::StatusCode::kUnknown) {
    absl::StatusCode canonical = code == absl::StatusCode::kDeadlineExceeded
                                     ? absl::StatusCode::kDeadlineExceeded
                                     : absl::StatusCode::kUnavailable;
    return WithErrorCode(absl::Status(canonical, message), v1::RPC_FAIL);
  }
  return absl::Status(code, message);
}

}  // namespace kvpool
