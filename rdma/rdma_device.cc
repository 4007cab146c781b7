#include "rdma/rdma_device.h"

#include <infiniband/verbs.h>

#include <cerrno>
#include <cstring>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"

namespace kvpool::rdma {
namespace {

constexpr int kQueueDepth = 256;
constexpr int kMaxSge = 16;

absl::Status Errno(absl::string_view what) {
  return absl::UnavailableError(absl::StrCat(what, ": ", std::strerror(errno)));
}

}  // namespace

MemoryRegion::~MemoryRegion() { ibv_dereg_mr(mr_); }
uint32_t MemoryRegion::lkey() const { return mr_->lkey; }
uint32_t MemoryRegion::rkey() const { return mr_->rkey; }

QueuePair::~QueuePair() {
  if (qp_ != nullptr) ibv_destroy_qp(qp_);
  if (cq_ != nullptr) ibv_destroy_cq(cq_);
}

absl::Status QueuePair::Connect(const QueuePairInfo& remote) {
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_INIT;
  attr.pkey_index = 0;
  attr.port_num = local_.port;
  attr.qp_access_flags = IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE;
  if (ibv_modify_qp(qp_, &attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)) {
    return Errno("queue pair to INIT");
  }
  attr = {};
  attr.qp_state = IBV_QPS_RTR;
  attr.path_mtu = static_cast<ibv_mtu>(std::min(local_.mtu, remote.mtu));
  attr.dest_qp_num = remote.qp_num;
  attr.rq_psn = remote.psn;
  attr.max_dest_rd_atomic = 16;
  attr.min_rnr_timer = 12;
  attr.ah_attr.dlid = remote.lid;
  attr.ah_attr.port_num = local_.port;
  bool global = std::any_of(std::begin(remote.gid), std::end(remote.gid), [](uint8_t b) { return b; });
  if (global) {  // RoCE, or InfiniBand across subnets
    attr.ah_attr.is_global = 1;
    std::memcpy(attr.ah_attr.grh.dgid.raw, remote.gid, 16);
    attr.ah_attr.grh.sgid_index = local_.gid_index;
    attr.ah_attr.grh.hop_limit = 64;
  }
  if (ibv_modify_qp(qp_, &attr,
                    IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                        IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER)) {
    return Errno("queue pair to RTR");
  }
  attr = {};
  attr.qp_state = IBV_QPS_RTS;
  attr.sq_psn = local_.psn;
  attr.timeout = 14;
  attr.retry_cnt = 7;
  attr.rnr_retry = 7;
  attr.max_rd_atomic = 16;
  if (ibv_modify_qp(qp_, &attr,
                    IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                        IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC)) {
    return Errno("queue pair to RTS");
  }
  return absl::OkStatus();
}

absl::Status QueuePair::Post(bool write, const Sge* sges, int num_sges, uint64_t remote_addr,
                             uint32_t rkey, uint64_t wr_id) {
  ibv_sge list[kMaxSge];
  if (num_sges > max_sge_ || num_sges > kMaxSge) {
    return absl::InvalidArgumentError("too many buffers for one RDMA request");
  }
  for (int i = 0; i < num_sges; ++i) list[i] = ibv_sge{sges[i].addr, sges[i].length, sges[i].lkey};
  ibv_send_wr wr{};
  wr.wr_id = wr_id;
  wr.sg_list = list;
  wr.num_sge = num_sges;
  wr.opcode = write ? IBV_WR_RDMA_WRITE : IBV_WR_RDMA_READ;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = remote_addr;
  wr.wr.rdma.rkey = rkey;
  ibv_send_wr* bad = nullptr;
  if (ibv_post_send(qp_, &wr, &bad) != 0) return Errno("posting an RDMA request");
  return absl::OkStatus();
}

absl::Status QueuePair::Wait(int count, absl::Time deadline) {
  ibv_wc completions[16];
  while (count > 0) {
    int n = ibv_poll_cq(cq_, std::min(count, 16), completions);
    if (n < 0) return absl::UnavailableError("polling the completion queue failed");
    for (int i = 0; i < n; ++i) {
      if (completions[i].status != IBV_WC_SUCCESS) {
        return absl::UnavailableError(
            absl::StrCat("RDMA request failed: ", ibv_wc_status_str(completions[i].status)));
      }
    }
    count -= n;
    if (n == 0) {
      if (absl::Now() > deadline) return absl::DeadlineExceededError("RDMA transfer timed out");
      std::this_thread::yield();
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<Device>> Device::Open(const std::string& name) {
  int count = 0;
  ibv_device** list = ibv_get_device_list(&count);
  if (list == nullptr || count == 0) {
    if (list != nullptr) ibv_free_device_list(list);
    return absl::UnavailableError("no RDMA device on this machine");
  }
  ibv_device* chosen = nullptr;
  for (int i = 0; i < count && chosen == nullptr; ++i) {
    if (name.empty() || name == ibv_get_device_name(list[i])) chosen = list[i];
  }
  if (chosen == nullptr) {
    ibv_free_device_list(list);
    return absl::NotFoundError(absl::StrCat("no RDMA device named ", name));
  }
  std::shared_ptr<Device> device(new Device());
  device->name_ = ibv_get_device_name(chosen);
  device->context_ = ibv_open_device(chosen);
  ibv_free_device_list(list);
  if (device->context_ == nullptr) return Errno("opening the RDMA device");
  device->pd_ = ibv_alloc_pd(device->context_);
  if (device->pd_ == nullptr) return Errno("allocating a protection domain");
  ibv_port_attr port{};
  if (ibv_query_port(device->context_, device->port_, &port) != 0) return Errno("querying port 1");
  if (port.state != IBV_PORT_ACTIVE) {
    return absl::UnavailableError(absl::StrCat("port 1 of ", device->name_, " is not active"));
  }
  device->lid_ = port.lid;
  device->mtu_ = static_cast<uint8_t>(port.active_mtu);
  ibv_gid gid{};
  if (ibv_query_gid(device->context_, device->port_, device->gid_index_, &gid) == 0) {
    std::memcpy(device->gid_, gid.raw, 16);
  }
  return device;
}

Device::~Device() {
  if (pd_ != nullptr) ibv_dealloc_pd(pd_);
  if (context_ != nullptr) ibv_close_device(context_);
}

absl::StatusOr<std::shared_ptr<MemoryRegion>> Device::Register(void* addr, uint64_t length,
                                                               bool remote) {
  int access = IBV_ACCESS_LOCAL_WRITE;
  if (remote) access |= IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE;
  ibv_mr* mr = ibv_reg_mr(pd_, addr, length, access);
  if (mr == nullptr) return Errno("registering memory");
  return std::shared_ptr<MemoryRegion>(
      new MemoryRegion(mr, reinterpret_cast<uint64_t>(addr), length));
}

absl::StatusOr<std::unique_ptr<QueuePair>> Device::CreateQueuePair() {
  std::unique_ptr<QueuePair> pair(new QueuePair());
  pair->cq_ = ibv_create_cq(context_, kQueueDepth, nullptr, nullptr, 0);
  if (pair->cq_ == nullptr) return Errno("creating a completion queue");
  ibv_qp_init_attr init{};
  init.send_cq = pair->cq_;
  init.recv_cq = pair->cq_;
  init.qp_type = IBV_QPT_RC;
  init.cap.max_send_wr = kQueueDepth;
  init.cap.max_recv_wr = 1;
  init.cap.max_send_sge = kMaxSge;
  init.cap.max_recv_sge = 1;
  pair->qp_ = ibv_create_qp(pd_, &init);
  if (pair->qp_ == nullptr) return Errno("creating a queue pair");
  pair->max_sge_ = static_cast<int>(std::min<uint32_t>(init.cap.max_send_sge, kMaxSge));
  pair->local_.qp_num = pair->qp_->qp_num;
  pair->local_.psn = std::random_device{}() & 0xFFFFFF;
  pair->local_.lid = lid_;
  std::memcpy(pair->local_.gid, gid_, 16);
  pair->local_.port = port_;
  pair->local_.gid_index = gid_index_;
  pair->local_.mtu = mtu_;
  return pair;
}

}  // namespace kvpool::rdma
