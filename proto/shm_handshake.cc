#include "proto/shm_handshake.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "proto/little_endian.h"

namespace kvpool::wire {
std::string EncodeShmHello() {
  std::string hello(kShmHelloSize, '\0');
  StoreLittleEndian<uint32_t>(reinterpret_cast<uint8_t*>(hello.data()) + 0, kShmHelloMagic);
  StoreLittleEndian<uint32_t>(reinterpret_cast<uint8_t*>(hello.data()) + 4, kShmVersion);
  return hello;
}

absl::Status DecodeShmHello(const uint8_t hello[kShmHelloSize]) {
  if (LoadLittleEndian<uint32_t>(hello + 0) != kShmHelloMagic) {
    return absl::InvalidArgumentError("not a kvpool shared-memory hello");
  }
  if (uint32_t version = LoadLittleEndian<uint32_t>(hello + 4); version != kShmVersion) {
    return absl::InvalidArgumentError(absl::StrCat("unsupported handshake version ", version));
  }
  return absl::OkStatus();
}

std::string EncodeShmAnswer(const ShmAnswer& answer) {
  std::string out(kShmAnswerSize, '\0');
  StoreLittleEndian<uint32_t>(reinterpret_cast<uint8_t*>(out.data()) + 0, kShmAnswerMagic);
  StoreLittleEndian<int32_t>(reinterpret_cast<uint8_t*>(out.data()) + 4, answer.status);
  StoreLittleEndian<uint64_t>(reinterpret_cast<uint8_t*>(out.data()) + 8, answer.pool_size);
  StoreLittleEndian<uint64_t>(reinterpret_cast<uint8_t*>(out.data()) + 16, answer.incarnation);
  StoreLittleEndian<uint32_t>(reinterpret_cast<uint8_t*>(out.data()) + 24, static_cast<uint32_t>(answer.reason.size()));
  return out + answer.reason;
}

absl::StatusOr<ShmAnswer> DecodeShmAnswer(const uint8_t fixed[kShmAnswerSize],
                                          uint32_t* reason_length) {
  if (LoadLittleEndian<uint32_t>(fixed + 0) != kShmAnswerMagic) {
    return absl::InvalidArgumentError("not a kvpool shared-memory answer");
  }
  ShmAnswer answer;
  answer.status = LoadLittleEndian<int32_t>(fixed + 4);
  answer.pool_size = LoadLittleEndian<uint64_t>(fixed + 8);
  answer.incarnation = LoadLittleEndian<uint64_t>(fixed + 16);
  *reason_length = LoadLittleEndian<uint32_t>(fixed + 24);
  if (*reason_length > 4096) return absl::InvalidArgumentError("reason too long");
  return answer;
}

}  // namespace kvpool::wire
