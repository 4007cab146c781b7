// libFuzzer target: the shared-memory admission handshake's decoders (proto/shm_handshake.h)
// on arbitrary bytes, the way the segment reads a hello and the client reads an answer. A
// hello decodes only with the magic and version EncodeShmHello writes; an answer that decodes
// encodes back to the same fixed part (with the reason length it announced) and announces at
// most 4096 reason bytes. New messages of the handshake add a case to kMessages below.

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "proto/little_endian.h"
#include "proto/shm_handshake.h"

namespace {

using namespace kvpool::wire;

void Hello(const uint8_t* data) {
  bool ok = DecodeShmHello(data).ok();
  std::string good = EncodeShmHello();
  // Exactly the magic and version matter; the reserved bytes are ignored.
  bool same_prefix = std::memcmp(data, good.data(), 8) == 0;
  if (ok != same_prefix) std::abort();
}

void Answer(const uint8_t* data) {
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

struct Message {
  size_t size;
  void (*check)(const uint8_t*);
};
constexpr Message kMessages[] = {{kShmHelloSize, Hello}, {kShmAnswerSize, Answer}};

}  // namespace

// The first byte picks the message; the rest is its bytes (zero-padded if short).
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const Message& message = kMessages[data[0] % (sizeof(kMessages) / sizeof(kMessages[0]))];
  std::string bytes(reinterpret_cast<const char*>(data + 1), size - 1);
  bytes.resize(std::max(bytes.size(), message.size), '\0');
  message.check(reinterpret_cast<const uint8_t*>(bytes.data()));
  return 0;
}
