#pragma once

// The shared-memory admission handshake (docs/protocol.md), shared by segment and client.
//
// A client on the segment's host connects to the segment's Unix socket and sends one hello.
// The segment checks the peer's credentials (SO_PEERCRED) against its admission policy and
// answers with one message: on admission the pool's size, with the pool's memfd attached
// (SCM_RIGHTS); on refusal a status and the reason. Then it closes the connection.
//
//   hello (16 bytes):  u32 magic "KVSH", u32 version (1), u64 reserved (0)
//   answer (32 bytes + reason): u32 magic "KVSA", i32 status (0 admitted, else ErrorCode),
//                      u64 pool size, u64 incarnation of the segment, u32 reason length,
//                      u32 reserved; then the reason
//
// The incarnation lets a client tell a restarted segment (new pool, same endpoint) from the
// one it mapped: placements carry the incarnation of the segment they are on.

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace kvpool::wire {

inline constexpr uint32_t kShmHelloMagic = 0x4853564B;   // "KVSH" in memory order
inline constexpr uint32_t kShmAnswerMagic = 0x4153564B;  // "KVSA" in memory order
inline constexpr uint32_t kShmVersion = 1;
inline constexpr size_t kShmHelloSize = 16;
inline constexpr size_t kShmAnswerSize = 32;

struct ShmAnswer {
  int32_t status = 0;
  uint64_t pool_size = 0;
  uint64_t incarnation = 0;
  std::string reason;
};

std::string EncodeShmHello();
// InvalidArgument for a wrong magic or version.
absl::Status DecodeShmHello(const uint8_t hello[kShmHelloSize]);

// The fixed part, followed by the reason bytes.
std::string EncodeShmAnswer(const ShmAnswer& answer);
// Decodes the fixed part; `reason` is filled by the caller from the bytes that follow.
absl::StatusOr<ShmAnswer> DecodeShmAnswer(const uint8_t fixed[kShmAnswerSize],
                                          uint32_t* reason_length);

}  // namespace kvpool::wire
