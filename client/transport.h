#pragma once

// How the client moves bytes to and from segments (step P2 of a put, G2 of a get). One
// implementation per transport (TCP, shared memory, RDMA); RoutingTransport picks one per op.

#include <sys/uio.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "proto/frame.h"

namespace kvpool::client {

// One range of one segment to write from, or read into, the caller's buffers.
struct TransferOp {
  wire::Opcode opcode = wire::Opcode::kRead;
  std::string endpoint;  // the segment's data plane, "host:port"
  std::string host;      // the segment's host, as it advertises it
  uint64_t incarnation = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
  wire::Token token{};
  // Caller buffers, `length` bytes in all.
  std::vector<iovec> iov;
  // READ_KEY (proto/key_read.h; TCP only): the tenant and key to read, `token` a key-read
  // credential, `length` the most bytes the buffers take. Once answered, `length` is the
  // value's size, `iov` the buffers it filled, and `key_checksum` its writer's checksum,
  // which the caller must compare.
  std::string tenant;
  std::string key;
  uint64_t key_checksum = 0;
  // The caller needs wire::Checksum of the op's bytes: for a read, to check them against their
  // writer's checksum; for a write, to record it at the commit. A transport that touches the
  // bytes anyway (TCP: a read as it arrives, a write just before it is sent) hashes them there,
  // while they are in this core's cache, and sets `checksum`; one that does not leaves it
  // unset and the caller hashes them itself.
  bool hash = false;
  std::optional<uint64_t> checksum;
  // Set by Execute: OK, or why this op failed (with its ErrorCode).
  absl::Status status;
};

class Transport {
 public:
  virtual ~Transport() = default;
  // Runs every op, in parallel where it can, and sets each op's status. Returns when all
  // have finished or the deadline passed (those ops fail with DeadlineExceeded).
  virtual void Execute(absl::Span<TransferOp> ops, absl::Time deadline) = 0;
  // Whether Execute would hash this write as it sends it (`hash` set), so that the caller need
  // not hash it beside. A hint: the caller still hashes any op left without `checksum`.
  virtual bool HashesWrite(const TransferOp& op) { return false; }
};

}  // namespace kvpool::client
