#pragma once

// The shared-memory admission handshake (docs/protocol.md), shared by segment and client.
//
// A client on the segment's host connects to the segment's Unix socket and sends one hello.
// The segment checks the peer's credentials (SO_PEERCRED) against its admission policy and
// answers with one message: on admission the pool's size, with the pool's memfd attached
// (SCM_RIGHTS); on refusal a status and the reason (and it closes the connection).
//
//   hello (16 bytes):  u32 magic "KVSH", u32 version (2), u64 reserved (0)
//   answer (32 bytes + reason): u32 magic "KVSA", i32 status (0 admitted, else ErrorCode),
//                      u64 pool size, u64 incarnation of the segment, u32 reason length,
//                      u32 reserved; then the reason
//
// The incarnation lets a client tell a restarted segment (new pool, same endpoint) from the
// one it mapped: placements carry the incarnation of the segment they are on.
//
// An admitted client keeps the connection open for as long as it has the pool mapped (its
// close, or the process's end, says the mapping is gone; there is no idle timeout). On it,
// write intents fence its shared-memory writes (docs/semantics.md, "Grants"): before copying
// into the pool it asks, for every write of a batch in one message, whether the write may
// start; it copies only the accepted ones and then says they are done. The client sends one
// message and reads its answer before sending the next. Every message is a 16-byte header
// followed by `count` entries (1 <= count <= kShmMaxEntries):
//
//   header (16 bytes): u32 magic, u32 count, u64 reserved (0)
//   INTENTS "KVSI" client -> segment, entry 48 bytes: u64 offset, u64 length,
//                      32-byte capability token of that range's WRITE grant
//   DONE    "KVSD" client -> segment, entry 8 bytes: u64 intent id, the writes copied (or
//                      abandoned) whose intents were accepted
//   ANSWER  "KVSR" segment -> client, one entry per entry of the message answered, in order,
//                      16 bytes: i32 status (0 or ErrorCode), u32 reserved (0), u64 intent id
//                      (INTENTS: the id of an accepted intent, 0 if refused; DONE: the id)
//
// Anything else (wrong magic, a count of 0 or above kShmMaxEntries, reserved bits set, an
// ANSWER sent to the segment) is a protocol error: the segment closes the connection, which
// ends every intent of it.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "proto/frame.h"

namespace kvpool::wire {

inline constexpr uint32_t kShmHelloMagic = 0x4853564B;   // "KVSH" in memory order
inline constexpr uint32_t kShmAnswerMagic = 0x4153564B;  // "KVSA" in memory order
inline constexpr uint32_t kShmVersion = 2;
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

// --- Write intents on the kept connection ---

inline constexpr uint32_t kShmIntentsMagic = 0x4953564B;  // "KVSI"
inline constexpr uint32_t kShmDoneMagic = 0x4453564B;     // "KVSD"
inline constexpr uint32_t kShmReplyMagic = 0x5253564B;    // "KVSR"
inline constexpr size_t kShmMessageHeaderSize = 16;
inline constexpr uint32_t kShmMaxEntries = 1024;
inline constexpr size_t kShmIntentEntrySize = 16 + kTokenSize;
inline constexpr size_t kShmDoneEntrySize = 8;
inline constexpr size_t kShmReplyEntrySize = 16;

enum class ShmMessageKind { kIntents, kDone, kReply };

// What a message header announces: its kind, its entry count, and the bytes of its entries.
struct ShmMessageHeader {
  ShmMessageKind kind = ShmMessageKind::kIntents;
  uint32_t count = 0;
  size_t body_size = 0;
};

// One write a client asks to start: its range and the token of its grant.
struct ShmIntent {
  uint64_t offset = 0;
  uint64_t length = 0;
  Token token{};
};

// One entry of an answer.
struct ShmReply {
  int32_t status = 0;
  uint64_t intent = 0;
};

// InvalidArgument for an unknown magic, a count of 0 or above kShmMaxEntries, or reserved
// bits set.
absl::StatusOr<ShmMessageHeader> DecodeShmMessageHeader(
    const uint8_t header[kShmMessageHeaderSize]);

// Whole messages (header and entries). `intents`, `ids`, `replies`: 1..kShmMaxEntries.
std::string EncodeShmIntents(absl::Span<const ShmIntent> intents);
std::string EncodeShmDone(absl::Span<const uint64_t> ids);
std::string EncodeShmReplies(absl::Span<const ShmReply> replies);

// The entries of a message whose header decoded as that kind; `body` is exactly its
// body_size bytes. InvalidArgument for a body of another size or reserved bits set.
absl::StatusOr<std::vector<ShmIntent>> DecodeShmIntents(const ShmMessageHeader& header,
                                                        absl::Span<const uint8_t> body);
absl::StatusOr<std::vector<uint64_t>> DecodeShmDone(const ShmMessageHeader& header,
                                                    absl::Span<const uint8_t> body);
absl::StatusOr<std::vector<ShmReply>> DecodeShmReplies(const ShmMessageHeader& header,
                                                       absl::Span<const uint8_t> body);

}  // namespace kvpool::wire
