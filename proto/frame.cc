#include "proto/frame.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace kvpool::wire {
namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the frame codec assumes little-endian");

template <typename T>
void Put(uint8_t* out, size_t at, T value) {
  std::memcpy(out + at, &value, sizeof(T));
}

template <typename T>
T Get(const uint8_t* in, size_t at) {
  T value;
  std::memcpy(&value, in + at, sizeof(T));
  return value;
}

}  // namespace

void EncodeRequest(const RequestHeader& header, uint8_t out[kRequestHeaderSize]) {
  Put<uint32_t>(out, 0, kRequestMagic);
  Put<uint8_t>(out, 4, kVersion);
  Put<uint8_t>(out, 5, static_cast<uint8_t>(header.opcode));
  Put<uint16_t>(out, 6, header.flags);
  Put<uint64_t>(out, 8, header.request_id);
  Put<uint64_t>(out, 16, header.offset);
  Put<uint64_t>(out, 24, header.length);
  std::memcpy(out + 32, header.token.data(), kTokenSize);
  Put<uint64_t>(out, 56, 0);
}

absl::StatusOr<RequestHeader> DecodeRequest(const uint8_t in[kRequestHeaderSize]) {
  uint32_t magic = Get<uint32_t>(in, 0);
  if (magic != kRequestMagic) {
    return absl::InvalidArgumentError(absl::StrFormat("bad request magic 0x%08x", magic));
  }
  uint8_t version = Get<uint8_t>(in, 4);
  if (version != kVersion) {
    return absl::InvalidArgumentError(absl::StrCat("unsupported frame version ", version));
  }
  uint8_t opcode = Get<uint8_t>(in, 5);
  if (opcode < static_cast<uint8_t>(Opcode::kRead) ||
      opcode > static_cast<uint8_t>(Opcode::kRdmaConnect)) {
    return absl::InvalidArgumentError(absl::StrCat("unknown opcode ", opcode));
  }
  RequestHeader header;
  header.opcode = static_cast<Opcode>(opcode);
  header.flags = Get<uint16_t>(in, 6);
  if (header.flags != 0) {
    return absl::InvalidArgumentError(absl::StrCat("unknown flags ", header.flags));
  }
  header.request_id = Get<uint64_t>(in, 8);
  header.offset = Get<uint64_t>(in, 16);
  header.length = Get<uint64_t>(in, 24);
  std::memcpy(header.token.data(), in + 32, kTokenSize);
  if (Get<uint64_t>(in, 56) != 0) return absl::InvalidArgumentError("reserved field is not 0");
  return header;
}

void EncodeResponse(const ResponseHeader& header, uint8_t out[kResponseHeaderSize]) {
  Put<uint32_t>(out, 0, kResponseMagic);
  Put<int32_t>(out, 4, header.status);
  Put<uint64_t>(out, 8, header.request_id);
  Put<uint64_t>(out, 16, header.length);
  Put<uint64_t>(out, 24, 0);
}

absl::StatusOr<ResponseHeader> DecodeResponse(const uint8_t in[kResponseHeaderSize]) {
  uint32_t magic = Get<uint32_t>(in, 0);
  if (magic != kResponseMagic) {
    return absl::InvalidArgumentError(absl::StrFormat("bad response magic 0x%08x", magic));
  }
  ResponseHeader header;
  header.status = Get<int32_t>(in, 4);
  header.request_id = Get<uint64_t>(in, 8);
  header.length = Get<uint64_t>(in, 16);
  return header;
}

}  // namespace kvpool::wire
