#include "client/rdma_transport.h"

#include <unistd.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "client/socket_io.h"
#include "common/log.h"
#include "common/net.h"
#include "proto/error_codes.h"
#include "proto/rdma_handshake.h"

namespace kvpool::client {
namespace {

constexpr uint64_t kPage = 4096;

absl::Status RdmaError(const std::string& endpoint, const absl::Status& cause) {
  return WithErrorCode(absl::Status(cause.code(), absl::StrCat("RDMA with segment ", endpoint,
                                                               ": ", cause.message())),
                       ErrorCode::TRANSFER_FAIL);
}

}  // namespace

RdmaTransport::~RdmaTransport() {
  absl::MutexLock lock(&mu_);
  for (auto& [endpoint, connection] : connections_) {
    if (connection->fd >= 0) close(connection->fd);
  }
}

bool RdmaTransport::available() {
  absl::MutexLock lock(&mu_);
  if (!tried_) {
    tried_ = true;
    absl::StatusOr<std::shared_ptr<rdma::Device>> device = rdma::Device::Open(device_name_);
    if (device.ok()) {
      device_ = std::move(*device);
      KVPOOL_LOG(INFO) << "RDMA transport on " << device_->name();
    } else {
      KVPOOL_LOG(DEBUG) << "no RDMA transport: " << device.status().message();
    }
  }
  return device_ != nullptr;
}

absl::Status RdmaTransport::Register(void* addr, size_t length) {
  if (!available()) return absl::UnavailableError("no RDMA device");
  return LocalKey(addr, length).status();
}

absl::StatusOr<uint32_t> RdmaTransport::LocalKey(const void* addr, size_t length) {
  uint64_t start = reinterpret_cast<uint64_t>(addr);
  absl::MutexLock lock(&mu_);
  auto it = regions_.upper_bound(start);
  if (it != regions_.begin()) {
    const rdma::MemoryRegion& region = *std::prev(it)->second;
    if (start + length <= region.addr() + region.length()) return region.lkey();
  }
  // Register whole pages around the buffer, and keep them for the next time.
  uint64_t first = start / kPage * kPage;
  uint64_t last = (start + length + kPage - 1) / kPage * kPage;
  absl::StatusOr<std::shared_ptr<rdma::MemoryRegion>> region =
      device_->Register(reinterpret_cast<void*>(first), last - first, /*remote=*/false);
  if (!region.ok()) return region.status();
  uint32_t lkey = (*region)->lkey();
  regions_[first] = std::move(*region);
  return lkey;
}

absl::StatusOr<RdmaTransport::Connection*> RdmaTransport::ConnectionFor(const TransferOp& op,
                                                                        absl::Time deadline) {
  std::shared_ptr<rdma::Device> device;
  {
    absl::MutexLock lock(&mu_);
    auto it = connections_.find(op.endpoint);
    if (it != connections_.end()) return it->second.get();
    device = device_;
  }
  absl::StatusOr<HostPort> address = ParseHostPort(op.endpoint);
  if (!address.ok()) return address.status();
  absl::StatusOr<std::unique_ptr<rdma::QueuePair>> pair = device->CreateQueuePair();
  if (!pair.ok()) return pair.status();
  absl::StatusOr<int> fd = ConnectTcp(address->host, address->port, deadline, 0);
  if (!fd.ok()) return fd.status();
  // RDMA_CONNECT, proving the grant of this op.
  uint8_t header[wire::kRequestHeaderSize];
  wire::EncodeRequest({.opcode = wire::Opcode::kRdmaConnect,
                       .offset = op.offset,
                       .length = op.length,
                       .token = op.token},
                      header);
  uint8_t payload[wire::kRdmaPayloadSize];
  wire::EncodeRdmaConnect({.granted_opcode = op.opcode, .info = (*pair)->local()}, payload);
  std::vector<iovec> request = {{header, sizeof(header)}, {payload, sizeof(payload)}};
  absl::Status sent = SendAll(*fd, absl::MakeSpan(request), deadline);
  uint8_t response[wire::kResponseHeaderSize];
  iovec response_iov{response, sizeof(response)};
  if (sent.ok()) sent = RecvAll(*fd, absl::MakeSpan(&response_iov, 1), deadline);
  absl::StatusOr<wire::ResponseHeader> answer =
      sent.ok() ? wire::DecodeResponse(response) : absl::StatusOr<wire::ResponseHeader>(sent);
  if (answer.ok() && (answer->status != 0 || answer->length != wire::kRdmaPayloadSize)) {
    answer = FromErrorCode(answer->status != 0 ? answer->status : ErrorCode::INTERNAL_ERROR,
                           "the segment does not serve RDMA");
  }
  iovec payload_iov{payload, sizeof(payload)};
  if (answer.ok()) sent = RecvAll(*fd, absl::MakeSpan(&payload_iov, 1), deadline);
  absl::StatusOr<wire::RdmaConnect> remote =
      !answer.ok()  ? absl::StatusOr<wire::RdmaConnect>(answer.status())
      : !sent.ok()  ? absl::StatusOr<wire::RdmaConnect>(sent)
                    : wire::DecodeRdmaConnect(payload, /*answer=*/true);
  absl::Status connected = remote.ok() ? (*pair)->Connect(remote->info) : remote.status();
  if (!connected.ok()) {
    close(*fd);
    return connected;
  }
  auto connection = std::make_unique<Connection>();
  connection->fd = *fd;
  connection->queue_pair = std::move(*pair);
  connection->remote = remote->info;
  absl::MutexLock lock(&mu_);
  auto [it, inserted] = connections_.try_emplace(op.endpoint, std::move(connection));
  if (!inserted) close(connection->fd);  // another thread connected first; use that one
  return it->second.get();
}

bool RdmaTransport::RunOnConnection(Connection& connection, absl::Span<TransferOp* const> ops,
                                    absl::Time deadline) {
  absl::MutexLock lock(&connection.mu);
  rdma::QueuePair& pair = *connection.queue_pair;
  int posted = 0;
  for (TransferOp* op : ops) {
    uint64_t remote = connection.remote.addr + op->offset;
    std::vector<rdma::QueuePair::Sge> sges;
    absl::Status status;
    for (const iovec& part : op->iov) {
      absl::StatusOr<uint32_t> lkey = LocalKey(part.iov_base, part.iov_len);
      if (!lkey.ok()) {
        status = lkey.status();
        break;
      }
      sges.push_back({reinterpret_cast<uint64_t>(part.iov_base),
                      static_cast<uint32_t>(part.iov_len), *lkey});
    }
    // Step P2/G2 over RDMA: one request per max_sge buffers, each to the next stretch of the
    // remote range.
    for (size_t first = 0; status.ok() && first < sges.size();
         first += static_cast<size_t>(pair.max_sge())) {
      size_t n = std::min(sges.size() - first, static_cast<size_t>(pair.max_sge()));
      status = pair.Post(op->opcode == wire::Opcode::kWrite, &sges[first], static_cast<int>(n),
                         remote, connection.remote.rkey, reinterpret_cast<uint64_t>(op));
      for (size_t i = first; i < first + n; ++i) remote += sges[i].length;
      if (status.ok()) ++posted;
    }
    op->status = status.ok() ? absl::OkStatus() : RdmaError(op->endpoint, status);
  }
  absl::Status done = pair.Wait(posted, deadline);
  if (done.ok()) return true;
  // Which request failed is not known: none of the posted ones counts as done.
  for (TransferOp* op : ops) {
    if (op->status.ok()) op->status = RdmaError(op->endpoint, done);
  }
  return false;
}

void RdmaTransport::Drop(const std::string& endpoint) {
  std::unique_ptr<Connection> connection;
  absl::MutexLock lock(&mu_);
  auto it = connections_.find(endpoint);
  if (it == connections_.end()) return;
  connection = std::move(it->second);
  connections_.erase(it);
  absl::MutexLock in_use(&connection->mu);  // wait for a batch still on it
  close(connection->fd);
}

void RdmaTransport::Execute(absl::Span<TransferOp* const> ops, absl::Time deadline) {
  if (!available()) {
    for (TransferOp* op : ops) op->status = absl::UnavailableError("no RDMA device");
    return;
  }
  absl::flat_hash_map<std::string, std::vector<TransferOp*>> by_endpoint;
  for (TransferOp* op : ops) by_endpoint[op->endpoint].push_back(op);
  for (auto& [endpoint, endpoint_ops] : by_endpoint) {
    bool refused_recently = false;
    {
      absl::MutexLock lock(&mu_);
      auto it = retry_after_.find(endpoint);
      refused_recently = it != retry_after_.end() && absl::Now() < it->second;
    }
    absl::StatusOr<Connection*> connection =
        refused_recently ? absl::UnavailableError("the segment refused RDMA recently")
                         : ConnectionFor(*endpoint_ops.front(), deadline);
    if (!connection.ok()) {
      if (!refused_recently) {
        absl::MutexLock lock(&mu_);
        retry_after_[endpoint] = absl::Now() + absl::Seconds(10);
      }
      for (TransferOp* op : endpoint_ops) op->status = RdmaError(endpoint, connection.status());
      continue;
    }
    if (!RunOnConnection(**connection, endpoint_ops, deadline)) Drop(endpoint);
  }
}

}  // namespace kvpool::client
