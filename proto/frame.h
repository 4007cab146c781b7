#pragma once

// The data-plane frame protocol between clients and kvpool-segment (docs/protocol.md).
//
// A request is a 64-byte header, followed for WRITE by `length` payload bytes. A response is
// a 32-byte header, followed by `length` bytes: the data for a successful READ, or a UTF-8
// reason when status is not 0. All integers are little-endian. Requests on one connection
// are answered in order, so a client may pipeline them.
//
//   request (64 bytes)                     response (32 bytes)
//   0  u32 magic "KVPL"                    0  u32 magic "KVPR"
//   4  u8  version (2)                     4  i32 status (ErrorCode, 0 = OK)
//   5  u8  opcode (1 READ, 2 WRITE,        8  u64 request_id (echoed)
//              3 PING, 4 RDMA_CONNECT)
//   6  u16 flags (0)                       16 u64 length of what follows
//   8  u64 request_id                      24 u64 reserved (0)
//   16 u64 offset in the pool
//   24 u64 length in bytes
//   32 u8[32] capability token (u64 expiry, u64 grant id, MAC:
//              proto/capability.h)

#include <array>
#include <cstdint>

#include "absl/status/statusor.h"

namespace kvpool::wire {

inline constexpr uint32_t kRequestMagic = 0x4C50564B;   // "KVPL" in memory order
inline constexpr uint32_t kResponseMagic = 0x5250564B;  // "KVPR" in memory order
inline constexpr uint8_t kVersion = 2;
inline constexpr size_t kRequestHeaderSize = 64;
inline constexpr size_t kResponseHeaderSize = 32;
inline constexpr size_t kTokenSize = 32;
// Error reasons in responses are cut to this many bytes.
inline constexpr size_t kMaxErrorMessage = 1024;

enum class Opcode : uint8_t {
  kRead = 1,
  kWrite = 2,
  kPing = 3,
  // Sets up an RDMA queue pair with the segment (proto/rdma_handshake.h); the header carries a
  // grant of the segment (offset, length, token) to prove the client is one of the master's.
  kRdmaConnect = 4,
};

using Token = std::array<uint8_t, kTokenSize>;

struct RequestHeader {
  Opcode opcode = Opcode::kPing;
  uint16_t flags = 0;
  uint64_t request_id = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
  Token token{};
};

struct ResponseHeader {
  int32_t status = 0;
  uint64_t request_id = 0;
  uint64_t length = 0;
};

void EncodeRequest(const RequestHeader& header, uint8_t out[kRequestHeaderSize]);
// InvalidArgument, with the reason, for a bad magic, version, opcode or flags.
absl::StatusOr<RequestHeader> DecodeRequest(const uint8_t in[kRequestHeaderSize]);

void EncodeResponse(const ResponseHeader& header, uint8_t out[kResponseHeaderSize]);
absl::StatusOr<ResponseHeader> DecodeResponse(const uint8_t in[kResponseHeaderSize]);

}  // namespace kvpool::wire
