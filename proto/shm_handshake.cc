#include "proto/shm_handshake.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace kvpool::wire {
namespace {

template <typename T>
void Put(std::string& out, size_t at, T value) {
  std::memcpy(out.data() + at, &value, sizeof(T));
}

template <typename T>
T Get(const uint8_t* in, size_t at) {
  T value;
  std::memcpy(&value, in + at, sizeof(T));
  return value;
}

}  // namespace

std::string EncodeShmHello() {
  std::string hello(kShmHelloSize, '\0');
  Put<uint32_t>(hello, 0, kShmHelloMagic);
  Put<uint32_t>(hello, 4, kShmVersion);
  return hello;
}

absl::Status DecodeShmHello(const uint8_t hello[kShmHelloSize]) {
  if (Get<uint32_t>(hello, 0) != kShmHelloMagic) {
    return absl::InvalidArgumentError("not a kvpool shared-memory hello");
  }
  if (uint32_t version = Get<uint32_t>(hello, 4); version != kShmVersion) {
    return absl::InvalidArgumentError(absl::StrCat("unsupported handshake version ", version));
  }
  return absl::OkStatus();
}

std::string EncodeShmAnswer(const ShmAnswer& answer) {
  std::string out(kShmAnswerSize, '\0');
  Put<uint32_t>(out, 0, kShmAnswerMagic);
  Put<int32_t>(out, 4, answer.status);
  Put<uint64_t>(out, 8, answer.pool_size);
  Put<uint64_t>(out, 16, answer.incarnation);
  Put<uint32_t>(out, 24, static_cast<uint32_t>(answer.reason.size()));
  return out + answer.reason;
}

absl::StatusOr<ShmAnswer> DecodeShmAnswer(const uint8_t fixed[kShmAnswerSize],
                                          uint32_t* reason_length) {
  if (Get<uint32_t>(fixed, 0) != kShmAnswerMagic) {
    return absl::InvalidArgumentError("not a kvpool shared-memory answer");
  }
  ShmAnswer answer;
  answer.status = Get<int32_t>(fixed, 4);
  answer.pool_size = Get<uint64_t>(fixed, 8);
  answer.incarnation = Get<uint64_t>(fixed, 16);
  *reason_length = Get<uint32_t>(fixed, 24);
  if (*reason_length > 4096) return absl::InvalidArgumentError("reason too long");
  return answer;
}

}  // namespace kvpool::wire
