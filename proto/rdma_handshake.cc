#include "proto/rdma_handshake.h"

#include <cstring>

namespace kvpool::wire {

void EncodeRdmaConnect(const RdmaConnect& connect, uint8_t out[kRdmaPayloadSize]) {
  std::memset(out, 0, kRdmaPayloadSize);
  const rdma::QueuePairInfo& info = connect.info;
  out[0] = static_cast<uint8_t>(connect.granted_opcode);
  out[1] = info.port;
  out[2] = info.gid_index;
  out[3] = info.mtu;
  std::memcpy(out + 4, &info.qp_num, 4);
  std::memcpy(out + 8, &info.psn, 4);
  std::memcpy(out + 12, &info.lid, 2);
  std::memcpy(out + 16, info.gid, 16);
  std::memcpy(out + 32, &info.addr, 8);
  std::memcpy(out + 40, &info.rkey, 4);
}

absl::StatusOr<RdmaConnect> DecodeRdmaConnect(const uint8_t in[kRdmaPayloadSize], bool answer) {
  RdmaConnect connect;
  uint8_t opcode = in[0];
  if (answer ? opcode != 0
             : opcode != static_cast<uint8_t>(Opcode::kRead) &&
                   opcode != static_cast<uint8_t>(Opcode::kWrite)) {
    return absl::InvalidArgumentError("bad granted opcode in an RDMA connect");
  }
  connect.granted_opcode = static_cast<Opcode>(answer ? 0 : opcode);
  rdma::QueuePairInfo& info = connect.info;
  info.port = in[1];
  info.gid_index = in[2];
  info.mtu = in[3];
  std::memcpy(&info.qp_num, in + 4, 4);
  std::memcpy(&info.psn, in + 8, 4);
  std::memcpy(&info.lid, in + 12, 2);
  std::memcpy(info.gid, in + 16, 16);
  std::memcpy(&info.addr, in + 32, 8);
  std::memcpy(&info.rkey, in + 40, 4);
  return connect;
}

}  // namespace kvpool::wire
