#include "client/tcp_transport.h"

#include <unistd.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/net.h"
#include "proto/checksum.h"
#include "proto/error_codes.h"

namespace kvpool::client {
namespace {

// A transfer failure of `endpoint`: keeps the canonical code (Unavailable, DeadlineExceeded)
// and marks it TRANSFER_FAIL.
absl::Status TransferError(const std::string& endpoint, const absl::Status& cause) {
  return WithErrorCode(
      absl::Status(cause.code(), absl::StrCat("segment ", endpoint, ": ", cause.message())),
      ErrorCode::TRANSFER_FAIL);
}

// Buffers per gathered send of pipelined requests (SendAll splits at IOV_MAX itself).
constexpr size_t kMaxSendParts = 1024;
// Bytes of writes hashed in the lane per send: about what a core's L2 keeps of them until the
// kernel copies them into the socket.
constexpr uint64_t kHashedSendBytes = 256 << 10;
// What a lane keeps in flight (answers and payloads not yet answered) before it takes more
// ops: enough to keep its socket full across a request's round trip, little enough that
// the lanes of a batch share out its last ops.
constexpr uint64_t kLaneBytesAhead = 2 << 20;
constexpr size_t kLaneOpsAhead = 3;

// The first `bytes` of the buffers `iov`.
std::vector<iovec> Truncated(const std::vector<iovec>& iov, uint64_t bytes) {
  std::vector<iovec> out;
  for (const iovec& part : iov) {
    if (bytes == 0) break;
    size_t take = std::min<uint64_t>(part.iov_len, bytes);
    out.push_back({part.iov_base, take});
    bytes -= take;
  }
  return out;
}

void FailAll(absl::Span<TransferOp* const> ops, const absl::Status& status) {
  for (TransferOp* op : ops) op->status = status;
}

}  // namespace

TcpTransport::TcpTransport(TcpTransportOptions options)
    : options_(options), tasks_(std::max(0, options.threads)) {
  if (options_.tls) {
    absl::StatusOr<std::shared_ptr<TlsContextSource>> tls =
        TlsContextSource::ForClient(*options_.tls);
    if (tls.ok()) {
      tls_ = *std::move(tls);
    } else {
      tls_error_ = tls.status();
    }
  }
}

TcpTransport::~TcpTransport() = default;

void TcpTransport::Execute(absl::Span<TransferOp> ops, absl::Time deadline) {
  if (!tls_error_.ok()) {
    for (TransferOp& op : ops) op.status = TransferError(op.endpoint, tls_error_);
    return;
  }
  // Each segment's ops are taken by up to connections_per_endpoint lanes; every lane runs in
  // parallel.
  absl::flat_hash_map<std::string, std::vector<TransferOp*>> by_endpoint;
  for (TransferOp& op : ops) by_endpoint[op.endpoint].push_back(&op);
  std::vector<std::unique_ptr<OpQueue>> queues;
  std::vector<std::function<void()>> tasks;
  for (auto& [endpoint, endpoint_ops] : by_endpoint) {
    int lanes = static_cast<int>(
        std::min<size_t>(std::max(1, options_.connections_per_endpoint), endpoint_ops.size()));
    queues.push_back(std::make_unique<OpQueue>(std::move(endpoint_ops), lanes));
    for (int i = 0; i < lanes; ++i) {
      tasks.push_back([this, endpoint = &endpoint, queue = queues.back().get(), deadline] {
        RunLane(*endpoint, *queue, deadline);
      });
    }
  }
  tasks_.Run(std::move(tasks));
}

void TcpTransport::OpQueue::GiveUp(const absl::Status& error) {
  if (lanes_.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  while (TransferOp* op = Take()) op->status = error;
}

void TcpTransport::RunLane(const std::string& endpoint, OpQueue& queue, absl::Time deadline) {
  std::vector<TransferOp*> ops;  // taken by this lane, in the order sent
  size_t done = 0;
  auto give_up = [&](const absl::Status& cause) {
    absl::Status error = TransferError(endpoint, cause);
    FailAll(absl::MakeSpan(ops).subspan(done), error);
    queue.GiveUp(error);
  };
  while (true) {
    if (done == ops.size()) {
      TransferOp* next = queue.Take();
      if (next == nullptr) return;
      ops.push_back(next);
    }
    absl::StatusOr<Lease> lease = Acquire(endpoint, deadline);
    if (!lease.ok()) {
      give_up(lease.status());
      return;
    }
    PipelineResult result = Pipeline(*lease->stream, endpoint, queue, ops, done, deadline);
    done += result.answered;
    if (result.io_error.ok() && result.in_step) {
      Release(endpoint, std::move(lease->stream));
      continue;
    }
    lease->stream.reset();
    if (result.io_error.ok()) continue;  // a rejection: go on with a fresh connection
    // A pooled connection may have died while idle (the segment restarted, or cut it after
    // a read it had served when the object went): retry on the next, until a fresh one.
    if (lease->reused && result.answered == 0 &&
        result.io_error.code() != absl::StatusCode::kDeadlineExceeded) {
      continue;
    }
    give_up(result.io_error);
    return;
  }
}

TcpTransport::PipelineResult TcpTransport::Pipeline(DataStream& stream, const std::string& endpoint,
                                                    OpQueue& queue, std::vector<TransferOp*>& ops,
                                                    size_t first, absl::Time deadline) {
  PipelineResult result;
  const size_t window = static_cast<size_t>(std::max(1, options_.pipeline_window));
  std::vector<uint8_t> headers(window * wire::kRequestHeaderSize);
  // Bytes of the ops in flight: their answers', or their payloads'.
  uint64_t in_flight = 0;
  std::vector<iovec> iov;
  size_t sent = 0;  // of ops[first...], as result.answered
  // Of the next answer's header, the bytes read with the value before it (what had arrived of
  // it by then, once its request is out: whatever that answer is, it begins with a header).
  uint8_t response[wire::kResponseHeaderSize];
  size_t header_read = 0;
  while (true) {
    // The requests go out in gathered sends: one, or one per kHashedSendBytes of writes hashed
    // here, so that the kernel copies bytes the hash has just brought into this core's cache.
    // More ops are taken from the queue only while little is in flight (once under half of
    // kLaneBytesAhead or kLaneOpsAhead ops, up to both, and at most the lane's share of the
    // batch at once), leaving the rest to whichever lane gets there first.
    iov.clear();
    uint64_t hashed_bytes = 0;
    const bool refill = in_flight < kLaneBytesAhead / 2 || sent - result.answered < kLaneOpsAhead;
    size_t taken_now = 0;
    while (sent - result.answered < window) {
      if (first + sent == ops.size()) {
        if (!refill || taken_now == queue.share() ||
            (in_flight >= kLaneBytesAhead && sent - result.answered >= kLaneOpsAhead)) {
          break;
        }
        TransferOp* taken = queue.Take();
        if (taken == nullptr) break;
        ops.push_back(taken);
        ++taken_now;
      }
      TransferOp& op = *ops[first + sent];
      const bool write = op.opcode == wire::Opcode::kWrite;
      const bool by_key = op.opcode == wire::Opcode::kReadKey;
      size_t parts = 1 + (write ? op.iov.size() : 0) + (by_key ? 2 : 0);
      if (!iov.empty() && iov.size() + parts > kMaxSendParts) break;
      uint8_t* header = &headers[(sent % window) * wire::kRequestHeaderSize];
      // A READ_KEY's tenant and key follow its header; its offset caps the answer.
      wire::EncodeRequest({.opcode = op.opcode,
                           .flags = static_cast<uint16_t>(by_key ? op.tenant.size() : 0),
                           .request_id = sent,
                           .offset = by_key ? op.length : op.offset,
                           .length = by_key ? op.tenant.size() + op.key.size() : op.length,
                           .token = op.token},
                          header);
      iov.push_back(iovec{header, wire::kRequestHeaderSize});
      if (by_key) {
        iov.push_back(iovec{op.tenant.data(), op.tenant.size()});
        iov.push_back(iovec{op.key.data(), op.key.size()});
      }
      if (write) {  // Step P2 over TCP: the header, then the payload from the caller's buffers
        iov.insert(iov.end(), op.iov.begin(), op.iov.end());
        if (op.hash) {
          op.checksum = wire::Checksum(op.iov);
          hashed_bytes += op.length;
        }
      }
      in_flight += op.length;
      ++sent;
      if (hashed_bytes >= kHashedSendBytes) {
        result.io_error = stream.Send(absl::MakeSpan(iov), deadline);
        if (!result.io_error.ok()) return result;
        iov.clear();
        hashed_bytes = 0;
      }
    }
    if (!iov.empty()) {
      result.io_error = stream.Send(absl::MakeSpan(iov), deadline);
      if (!result.io_error.ok()) return result;
    }
    if (result.answered == sent) return result;  // all answered, none left to take
    TransferOp& op = *ops[first + result.answered];
    in_flight -= op.length;  // (as sent: a READ_KEY's is cut to its answer's only below)
    if (header_read < sizeof(response)) {
      iovec response_iov{response + header_read, sizeof(response) - header_read};
      result.io_error = stream.Recv(absl::MakeSpan(&response_iov, 1), deadline);
      if (!result.io_error.ok()) return result;
    }
    header_read = 0;
    absl::StatusOr<wire::ResponseHeader> header = wire::DecodeResponse(response);
    if (!header.ok() || header->request_id != result.answered) {
      result.io_error = absl::UnavailableError(
          header.ok() ? "response out of order" : std::string(header.status().message()));
      return result;
    }
    if (header->status != 0) {
      if (header->length > wire::kMaxErrorMessage) {
        result.io_error = absl::UnavailableError("error reason longer than the protocol allows");
        return result;
      }
      std::string reason(header->length, '\0');
      iovec reason_iov{reason.data(), reason.size()};
      (void)stream.Recv(absl::MakeSpan(&reason_iov, 1), deadline);
      op.status = FromErrorCode(header->status, absl::StrCat("segment ", endpoint, ": ", reason));
      ++result.answered;
      // A read by key of a value not there (or too large) leaves the connection in step.
      if (op.opcode == wire::Opcode::kReadKey && (header->status == ErrorCode::OBJECT_NOT_FOUND ||
                                                  header->status == ErrorCode::BUFFER_OVERFLOW)) {
        continue;
      }
      result.in_step = false;
      return result;
    }
    const bool by_key = op.opcode == wire::Opcode::kReadKey;
    uint64_t expected = op.opcode == wire::Opcode::kRead ? op.length : 0;
    if (by_key ? header->length == 0 || header->length > op.length : header->length != expected) {
      result.io_error = absl::UnavailableError(
          absl::StrCat("segment answered ", header->length, " bytes, expected ",
                       by_key ? absl::StrCat("1 to ", op.length) : absl::StrCat(expected)));
      return result;
    }
    if (by_key) {
      op.length = expected = header->length;
      op.iov = Truncated(op.iov, expected);
      op.key_checksum = header->checksum;
    }
    if (expected > 0) {
      std::vector<iovec> target = op.iov;
      if (result.answered + 1 < sent) target.push_back(iovec{response, sizeof(response)});
      absl::StatusOr<size_t> got = stream.RecvAtLeast(absl::MakeSpan(target), expected, deadline);
      if (!got.ok()) {
        result.io_error = got.status();
        return result;
      }
      header_read = *got - expected;
      // Step G2's check, hashed in this lane while the bytes are in its cache (the next
      // answer meanwhile fills the socket's buffer); the caller compares.
      if (op.hash) op.checksum = wire::Checksum(op.iov);
    }
    op.status = absl::OkStatus();
    ++result.answered;
  }
}

absl::StatusOr<TcpTransport::Lease> TcpTransport::Acquire(const std::string& endpoint,
                                                          absl::Time deadline) {
  {
    absl::MutexLock lock(&mu_);
    auto it = idle_.find(endpoint);
    if (it != idle_.end() && !it->second.empty()) {
      std::unique_ptr<DataStream> stream = std::move(it->second.back());
      it->second.pop_back();
      return Lease{std::move(stream), true};
    }
  }
  absl::StatusOr<HostPort> address = ParseHostPort(endpoint);
  if (!address.ok()) return address.status();
  absl::StatusOr<std::unique_ptr<DataStream>> stream = ConnectDataStream(
      address->host, address->port, deadline, options_.socket_buffer_bytes, tls_.get());
  if (!stream.ok()) return stream.status();
  return Lease{*std::move(stream), false};
}

void TcpTransport::Release(const std::string& endpoint, std::unique_ptr<DataStream> stream) {
  absl::MutexLock lock(&mu_);
  idle_[endpoint].push_back(std::move(stream));
}

}  // namespace kvpool::client
