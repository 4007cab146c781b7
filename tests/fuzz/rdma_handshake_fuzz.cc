// libFuzzer target: the RDMA connect exchange's payload decoder (proto/rdma_handshake.h) on
// arbitrary bytes, as a request (segment side) and as an answer (client side). A request
// decodes only with a granted opcode READ or WRITE, an answer only with 0; what decodes encodes
// back to the same bytes, but for the reserved ones (14-15, 44-63).

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "proto/rdma_handshake.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvpool::wire;
  std::string bytes(reinterpret_cast<const char*>(data), size);
  bytes.resize(std::max(bytes.size(), kRdmaPayloadSize), '\0');
  const uint8_t* in = reinterpret_cast<const uint8_t*>(bytes.data());
  for (bool answer : {false, true}) {
    absl::StatusOr<RdmaConnect> connect = DecodeRdmaConnect(in, answer);
    const bool valid = answer ? in[0] == 0
                              : in[0] == static_cast<uint8_t>(Opcode::kRead) ||
                                    in[0] == static_cast<uint8_t>(Opcode::kWrite);
    if (connect.ok() != valid) std::abort();
    if (!connect.ok()) continue;
    uint8_t again[kRdmaPayloadSize];
    EncodeRdmaConnect(*connect, again);
    if (std::memcmp(again, in, 14) != 0 || std::memcmp(again + 16, in + 16, 28) != 0) {
      std::abort();
    }
    for (size_t i : {14, 15}) {
      if (again[i] != 0) std::abort();
    }
    for (size_t i = 44; i < kRdmaPayloadSize; ++i) {
      if (again[i] != 0) std::abort();
    }
  }
  return 0;
}
