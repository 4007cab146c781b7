#pragma once

// The one place where the project's three error vocabularies meet: absl::Status inside C++,
// the per-key numeric codes of the wire (kvpool.v1.ErrorCode, Mooncake-compatible), and
// grpc::Status for whole-call failures.
//
// A status that came from a numeric code carries that code as a payload, so the conversion
// round-trips exactly (CHECKSUM_MISMATCH stays -801, not just DataLoss).

#include <cstdint>
#include "absl/strings/string_view.h"

#include "absl/status/status.h"
#include "grpcpp/support/status.h"
#include "kvpool/v1/common.pb.h"

namespace kvpool {

using ErrorCode = v1::ErrorCode;

// Builds a status with the canonical code that matches `code` and the code as payload.
absl::Status ErrorStatus(ErrorCode code, absl::string_view message);

// `status` with `code` attached (message and canonical code kept), e.g. a DeadlineExceeded
// of the data path marked TRANSFER_FAIL.
absl::Status WithErrorCode(absl::Status status, ErrorCode code);

// The numeric code of a status: its payload if it has one, else the closest code for its
// canonical code (NotFound -> OBJECT_NOT_FOUND, ResourceExhausted -> NO_AVAILABLE_HANDLE, ...).
int32_t ToErrorCode(const absl::Status& status);

// Inverse of ToErrorCode. Unknown numbers become Internal with the number in the message.
absl::Status FromErrorCode(int32_t code, absl::string_view message);

// "NO_AVAILABLE_HANDLE" for -200; "UNKNOWN(-12)" for numbers the enum does not have.
std::string ErrorCodeName(int32_t code);

grpc::Status ToGrpcStatus(const absl::Status& status);
// A failed RPC becomes RPC_FAIL (Unavailable or DeadlineExceeded) unless the server sent a
// more specific canonical code.
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace kvpool
