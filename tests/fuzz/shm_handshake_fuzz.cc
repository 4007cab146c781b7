// libFuzzer target: the shared-memory protocol's decoders (proto/shm_handshake.h) on
// arbitrary bytes, the way the segment reads a hello and, on the kept connection, a client's
// INTENTS and DONE messages, and the client reads the admission answer and the segment's
// answers (REPLY) to its intents. A hello decodes only with the magic and version
// EncodeShmHello writes; an answer that decodes encodes back to the same fixed part (with
// the reason length it announced) and announces at most 4096 reason bytes. A message header
// that decodes has a known magic, 1..kShmMaxEntries entries, and announces exactly count
// entries of its kind's size; its body decodes only as that kind, and what decodes encodes
// back to the very bytes read (no field is dropped or invented). New messages of the
// protocol add a case to kMessages below.

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "proto/little_endian.h"
#include "proto/shm_handshake.h"

namespace {

using namespace kvpool::wire;

void Hello(const uint8_t* data, size_t) {
  bool ok = DecodeShmHello(data).ok();
  std::string good = EncodeShmHello();
  // Exactly the magic and version matter; the reserved bytes are ignored.
  bool same_prefix = std::memcmp(data, good.data(), 8) == 0;
  if (ok != same_prefix) std::abort();
}

void Answer(const uint8_t* data, size_t) {
  uint32_t reason_length = 0;
  absl::StatusOr<ShmAnswer> answer = DecodeShmAnswer(data, &reason_length);
  if (!answer.ok()) return;
  if (reason_length > 4096) std::abort();
  ShmAnswer again = *answer;
  again.reason.assign(reason_length, 'r');
  std::string encoded = EncodeShmAnswer(again);
  // Bytes 28..31 are reserved (written as zero, not read).
  if (encoded.size() != kShmAnswerSize + reason_length || std::memcmp(encoded.data(), data, 28)) {
    std::abort();
  }
}

size_t EntrySize(ShmMessageKind kind) {
  switch (kind) {
    case ShmMessageKind::kIntents:
      return kShmIntentEntrySize;
    case ShmMessageKind::kDone:
      return kShmDoneEntrySize;
    case ShmMessageKind::kReply:
      return kShmReplyEntrySize;
  }
  std::abort();
}

// An INTENTS, DONE or REPLY message: a header, then as much body as the input holds.
void KeptConnectionMessage(const uint8_t* data, size_t size) {
  absl::StatusOr<ShmMessageHeader> header = DecodeShmMessageHeader(data);
  if (!header.ok()) return;
  if (header->count == 0 || header->count > kShmMaxEntries ||
      header->body_size != header->count * EntrySize(header->kind)) {
    std::abort();
  }
  absl::Span<const uint8_t> rest(data + kShmMessageHeaderSize, size - kShmMessageHeaderSize);
  // A body of the wrong size (the reader got fewer bytes, or more) never decodes.
  if (rest.size() != header->body_size) {
    if (DecodeShmIntents(*header, rest).ok() || DecodeShmDone(*header, rest).ok() ||
        DecodeShmReplies(*header, rest).ok()) {
      std::abort();
    }
    if (rest.size() < header->body_size) return;
    rest = rest.subspan(0, header->body_size);
  }
  std::string whole(reinterpret_cast<const char*>(data), kShmMessageHeaderSize + rest.size());
  auto intents = DecodeShmIntents(*header, rest);
  auto done = DecodeShmDone(*header, rest);
  auto replies = DecodeShmReplies(*header, rest);
  // Only the header's kind decodes.
  if ((intents.ok() && header->kind != ShmMessageKind::kIntents) ||
      (done.ok() && header->kind != ShmMessageKind::kDone) ||
      (replies.ok() && header->kind != ShmMessageKind::kReply)) {
    std::abort();
  }
  std::string again;
  if (intents.ok()) {
    if (intents->size() != header->count) std::abort();
    again = EncodeShmIntents(*intents);
  } else if (done.ok()) {
    if (done->size() != header->count) std::abort();
    again = EncodeShmDone(*done);
  } else if (replies.ok()) {
    if (replies->size() != header->count) std::abort();
    again = EncodeShmReplies(*replies);
  } else {
    // Intents and DONE bodies have no reserved bits: any bytes of the right size decode.
    if (header->kind != ShmMessageKind::kReply) std::abort();
    return;
  }
  if (again != whole) std::abort();
}

struct Message {
  size_t size;  // the least the reader reads before decoding
  void (*check)(const uint8_t*, size_t);
};
constexpr Message kMessages[] = {{kShmHelloSize, Hello},
                                 {kShmAnswerSize, Answer},
                                 {kShmMessageHeaderSize, KeptConnectionMessage}};

}  // namespace

// The first byte picks the message; the rest is its bytes (zero-padded if short).
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const Message& message = kMessages[data[0] % (sizeof(kMessages) / sizeof(kMessages[0]))];
  std::string bytes(reinterpret_cast<const char*>(data + 1), size - 1);
  bytes.resize(std::max(bytes.size(), message.size), '\0');
  message.check(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  return 0;
}
