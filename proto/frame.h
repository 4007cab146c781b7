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
//              3 PING, 4 RDMA_CONNECT,
//              5 READ_KEY)
//   6  u16 flags (0; READ_KEY: the         16 u64 length of what follows
//              tenant's length)
//   8  u64 request_id                      24 u64 READ_KEY: the value's checksum (else 0)
//   16 u64 offset in the pool (READ_KEY: the most value bytes the client takes)
//   24 u64 length in bytes (READ_KEY: of the tenant and key that follow the header)
//   32 u8[32] capability token (u64 expiry, u64 grant id, MAC:
//              proto/capability.h; READ_KEY: a key-read credential, proto/key_read.h)

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
  // Reads a committed object by its key (proto/key_read.h): the header is followed by the
  // tenant (flags bytes) and the key (the rest of length); offset caps the answer's size.
  kReadKey = 5,
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
  // A READ_KEY's answer: the checksum its writer declared for the value.
  uint64_t checksum = 0;
};

void EncodeRequest(const RequestHeader& header, uint8_t out[kRequestHeaderSize]);
// InvalidArgument, with the reason, for a bad magic, version, opcode or flags (only READ_KEY
// has flags).
absl::StatusOr<RequestHeader> DecodeRequest(const uint8_t in[kRequestHeaderSize]);

void EncodeResponse(const ResponseHeader& header, uint8_t out[kResponseHeaderSize]);
absl::StatusOr<ResponseHeader> DecodeResponse(const uint8_t in[kResponseHeaderSize]);

}  // namespace kvpool::wire
