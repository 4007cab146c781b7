#include "proto/frame.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "proto/little_endian.h"

namespace kvpool::wire {
void EncodeRequest(const RequestHeader& header, uint8_t out[kRequestHeaderSize]) {
  StoreLittleEndian<uint32_t>(out + 0, kRequestMagic);
  StoreLittleEndian<uint8_t>(out + 4, kVersion);
  StoreLittleEndian<uint8_t>(out + 5, static_cast<uint8_t>(header.opcode));
  StoreLittleEndian<uint16_t>(out + 6, header.flags);
  StoreLittleEndian<uint64_t>(out + 8, header.request_id);
  StoreLittleEndian<uint64_t>(out + 16, header.offset);
  StoreLittleEndian<uint64_t>(out + 24, header.length);
  std::memcpy(out + 32, header.token.data(), kTokenSize);
}

absl::StatusOr<RequestHeader> DecodeRequest(const uint8_t in[kRequestHeaderSize]) {
  uint32_t magic = LoadLittleEndian<uint32_t>(in + 0);
  if (magic != kRequestMagic) {
    return absl::InvalidArgumentError(absl::StrFormat("bad request magic 0x%08x", magic));
  }
  uint8_t version = LoadLittleEndian<uint8_t>(in + 4);
  if (version != kVersion) {
    return absl::InvalidArgumentError(absl::StrCat("unsupported frame version ", version));
  }
  uint8_t opcode = LoadLittleEndian<uint8_t>(in + 5);
  if (opcode < static_cast<uint8_t>(Opcode::kRead) ||
      opcode > static_cast<uint8_t>(Opcode::kReadKey)) {
    return absl::InvalidArgumentError(absl::StrCat("unknown opcode ", opcode));
  }
  RequestHeader header;
  header.opcode = static_cast<Opcode>(opcode);
  header.flags = LoadLittleEndian<uint16_t>(in + 6);
  if (header.flags != 0 && header.opcode != Opcode::kReadKey) {
    return absl::InvalidArgumentError(absl::StrCat("unknown flags ", header.flags));
  }
  header.request_id = LoadLittleEndian<uint64_t>(in + 8);
  header.offset = LoadLittleEndian<uint64_t>(in + 16);
  header.length = LoadLittleEndian<uint64_t>(in + 24);
  std::memcpy(header.token.data(), in + 32, kTokenSize);
  return header;
}

void EncodeResponse(const ResponseHeader& header, uint8_t out[kResponseHeaderSize]) {
  StoreLittleEndian<uint32_t>(out + 0, kResponseMagic);
  StoreLittleEndian<int32_t>(out + 4, header.status);
  StoreLittleEndian<uint64_t>(out + 8, header.request_id);
  StoreLittleEndian<uint64_t>(out + 16, header.length);
  StoreLittleEndian<uint64_t>(out + 24, header.checksum);
}

absl::StatusOr<ResponseHeader> DecodeResponse(const uint8_t in[kResponseHeaderSize]) {
  uint32_t magic = LoadLittleEndian<uint32_t>(in + 0);
  if (magic != kResponseMagic) {
    return absl::InvalidArgumentError(absl::StrFormat("bad response magic 0x%08x", magic));
  }
  ResponseHeader header;
  header.status = LoadLittleEndian<int32_t>(in + 4);
  header.request_id = LoadLittleEndian<uint64_t>(in + 8);
  header.length = LoadLittleEndian<uint64_t>(in + 16);
  header.checksum = LoadLittleEndian<uint64_t>(in + 24);
  return header;
}

}  // namespace kvpool::wire
