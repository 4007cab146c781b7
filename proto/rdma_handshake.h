#pragma once

// The RDMA connect exchange (docs/protocol.md), over a data-plane TCP connection.
//
// The client sends a RDMA_CONNECT frame whose header carries one of its grants for the
// segment (offset, length, token), followed by a 64-byte payload: the grant's opcode and the
// client's queue-pair info. The segment checks the grant, creates a queue pair connected to
// the client's, and answers with status 0 and a 64-byte payload: its queue-pair info, the
// address of its pool and the pool's remote key. The queue pair lives as long as that TCP
// connection.
//
//   payload: u8 granted opcode (request) / 0 (answer), u8 port, u8 gid index, u8 mtu,
//            u32 qp number, u32 psn, u16 lid, u16 reserved, u8[16] gid, u64 address, u32 rkey,
//            u8[20] reserved

#include <cstdint>

#include "absl/status/statusor.h"
#include "proto/frame.h"
#include "rdma/rdma_device.h"

namespace kvpool::wire {

inline constexpr size_t kRdmaPayloadSize = 64;

struct RdmaConnect {
  Opcode granted_opcode = Opcode::kRead;
  rdma::QueuePairInfo info;
};

void EncodeRdmaConnect(const RdmaConnect& connect, uint8_t out[kRdmaPayloadSize]);
// InvalidArgument if the granted opcode is not READ or WRITE (requests) or not 0 (answers).
absl::StatusOr<RdmaConnect> DecodeRdmaConnect(const uint8_t in[kRdmaPayloadSize], bool answer);

}  // namespace kvpool::wire
