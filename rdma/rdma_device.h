#pragma once

// The RDMA building blocks both sides share (libibverbs): a device with its protection
// domain, reliable-connected queue pairs, and registered memory. Clients use them to read and
// write a segment's pool with one-sided RDMA READ/WRITE; segments to expose their pool.
// Nothing here runs without an RDMA device; Open() says so and callers fall back to TCP.
// Thread-safe unless noted.

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

struct ibv_context;
struct ibv_pd;
struct ibv_cq;
struct ibv_qp;
struct ibv_mr;

namespace kvpool::rdma {

// What one side of a queue pair tells the other (proto/rdma_handshake.h carries it).
struct QueuePairInfo {
  uint32_t qp_num = 0;
  uint32_t psn = 0;
  uint16_t lid = 0;
  uint8_t gid[16] = {};
  uint8_t port = 1;
  uint8_t gid_index = 0;
  uint8_t mtu = 0;  // enum ibv_mtu
  // The memory the other side may address: base address and remote key (segment side).
  uint64_t addr = 0;
  uint32_t rkey = 0;
};

class Device;

// Registered memory; deregistered with the last reference.
class MemoryRegion {
 public:
  ~MemoryRegion();
  uint32_t lkey() const;
  uint32_t rkey() const;
  uint64_t addr() const { return addr_; }
  uint64_t length() const { return length_; }

 private:
  friend class Device;
  MemoryRegion(ibv_mr* mr, uint64_t addr, uint64_t length) : mr_(mr), addr_(addr), length_(length) {}
  ibv_mr* mr_;
  uint64_t addr_;
  uint64_t length_;
};

// A reliable-connected queue pair with its own completion queue. Thread-compatible: one
// user at a time.
class QueuePair {
 public:
  ~QueuePair();
  // This side's half of the handshake.
  const QueuePairInfo& local() const { return local_; }
  // Moves the pair to ready-to-send against `remote`.
  absl::Status Connect(const QueuePairInfo& remote);

  struct Sge {
    uint64_t addr;
    uint32_t length;
    uint32_t lkey;
  };
  // Posts one signaled RDMA READ (write=false) or WRITE of `sges` to remote_addr/rkey.
  absl::Status Post(bool write, const Sge* sges, int num_sges, uint64_t remote_addr,
                    uint32_t rkey, uint64_t wr_id);
  // Waits for `count` completions; DeadlineExceeded if they do not come in time, Unavailable
  // (with the completion status) if one failed.
  absl::Status Wait(int count, absl::Time deadline);
  int max_sge() const { return max_sge_; }

 private:
  friend class Device;
  QueuePair() = default;
  ibv_cq* cq_ = nullptr;
  ibv_qp* qp_ = nullptr;
  QueuePairInfo local_;
  int max_sge_ = 1;
};

class Device {
 public:
  // Opens the named device (empty: the first one) and its port 1. Unavailable when there is
  // no RDMA device, with the reason.
  static absl::StatusOr<std::shared_ptr<Device>> Open(const std::string& name);
  ~Device();

  const std::string& name() const { return name_; }

  // Registers [addr, addr + length) for local access and, if `remote`, remote READ/WRITE.
  absl::StatusOr<std::shared_ptr<MemoryRegion>> Register(void* addr, uint64_t length, bool remote);

  absl::StatusOr<std::unique_ptr<QueuePair>> CreateQueuePair();

 private:
  Device() = default;
  std::string name_;
  ibv_context* context_ = nullptr;
  ibv_pd* pd_ = nullptr;
  uint8_t port_ = 1;
  uint16_t lid_ = 0;
  uint8_t gid_index_ = 0;
  uint8_t gid_[16] = {};
  uint8_t mtu_ = 0;
};

}  // namespace kvpool::rdma
