#include "server/segment/data_server.h"

#include <boost/asio.hpp>

#include <array>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "server/common/listen.h"
#include "proto/capability.h"
#include "proto/error_codes.h"
#include "proto/frame.h"
#include "proto/rdma_handshake.h"

namespace kvpool::segment {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

namespace {

// What every connection of a server shares.
struct ServerState {
  const MemoryPool& pool;
  const std::string secret;
  const DataServerOptions options;
  Manifest* const manifest;
  std::atomic<uint64_t> reads{0}, writes{0}, bytes_read{0}, bytes_written{0};
  std::atomic<uint64_t> rejected_malformed{0}, rejected_range{0}, rejected_token{0},
      rejected_expired{0};
  LatencyHistogram read_latency, write_latency;
};

// One client connection. Requests are handled one after another, so at most one
// asynchronous operation is outstanding and no strand is needed.
class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(tcp::socket socket, ServerState& server)
      : socket_(std::move(socket)), server_(server) {
    boost::system::error_code ignored;
    peer_ = absl::StrCat(socket_.remote_endpoint(ignored).address().to_string(ignored), ":",
                         socket_.remote_endpoint(ignored).port());
  }

  void Start() { ReadHeader(); }

 private:
  void ReadHeader() {
    asio::async_read(socket_, asio::buffer(header_),
                     [self = shared_from_this()](boost::system::error_code ec, size_t n) {
                       self->OnHeader(ec, n);
                     });
  }

  void OnHeader(boost::system::error_code ec, size_t n) {
    if (ec) {
      if (ec != asio::error::eof || n != 0) {
        KVPOOL_LOG(WARNING) << "data connection from " << peer_ << " closed mid-header (" << n
                            << " of " << wire::kRequestHeaderSize << " bytes): " << ec.message();
      }
      return;
    }
    started_ = absl::Now();
    absl::StatusOr<wire::RequestHeader> request = wire::DecodeRequest(header_.data());
    if (!request.ok()) {
      Reject(0, v1::INVALID_PARAMS, absl::StrCat("malformed frame: ", request.status().message()),
             server_.rejected_malformed);
      return;
    }
    request_ = *request;
    // Step P2/G2 (segment side): check the range and the capability before any byte moves.
    if (request_.opcode == wire::Opcode::kPing) {
      Respond(0, 0);
      return;
    }
    if (request_.opcode == wire::Opcode::kRdmaConnect) {
      asio::async_read(socket_, asio::buffer(rdma_payload_),
                       [self = shared_from_this()](boost::system::error_code ec, size_t) {
                         if (!ec) self->OnRdmaConnect();
                       });
      return;
    }
    bool write = request_.opcode == wire::Opcode::kWrite;
    if (!server_.pool.Contains(request_.offset, request_.length)) {
      Reject(request_.request_id, write ? v1::INVALID_WRITE : v1::INVALID_READ,
             absl::StrCat("range [", request_.offset, ", +", request_.length,
                          ") is outside the pool of ", server_.pool.size(), " bytes"),
             server_.rejected_range);
      return;
    }
    if (server_.options.require_token) {
      absl::Status granted = wire::VerifyToken(server_.secret, request_, absl::Now());
      if (!granted.ok()) {
        bool expired = granted.code() == absl::StatusCode::kDeadlineExceeded;
        Reject(request_.request_id, expired ? v1::LEASE_EXPIRED : v1::PERMISSION_DENIED,
               absl::StrCat(granted.message(), expired ? (write ? " (reservation timed out)"
                                                                 : " (lease ran out)")
                                                       : ""),
               expired ? server_.rejected_expired : server_.rejected_token);
        return;
      }
    }
    uint8_t* range = server_.pool.data() + request_.offset;
    if (write) {
      // The master granted this range to a new object: what the manifest had there is gone.
      if (server_.manifest != nullptr) {
        server_.manifest->DropOverlapping(request_.offset, request_.length);
      }
      asio::async_read(socket_, asio::buffer(range, request_.length),
                       [self = shared_from_this()](boost::system::error_code ec, size_t n) {
                         self->OnPayload(ec, n);
                       });
    } else {
      SendRead(range);
    }
  }

  // A client asks for a queue pair; it must hold a grant of this segment (any range).
  void OnRdmaConnect() {
    absl::StatusOr<wire::RdmaConnect> connect =
        wire::DecodeRdmaConnect(rdma_payload_.data(), /*answer=*/false);
    if (!connect.ok()) {
      Reject(request_.request_id, v1::INVALID_PARAMS, connect.status().message(),
             server_.rejected_malformed);
      return;
    }
    wire::RequestHeader grant = request_;
    grant.opcode = connect->granted_opcode;
    if (server_.options.require_token) {
      absl::Status granted = wire::VerifyToken(server_.secret, grant, absl::Now());
      if (!granted.ok()) {
        Reject(request_.request_id, v1::PERMISSION_DENIED, granted.message(),
               server_.rejected_token);
        return;
      }
    }
    if (!server_.options.rdma_accept) {
      Reject(request_.request_id, v1::INVALID_PARAMS, "RDMA is off on this segment",
             server_.rejected_malformed);
      return;
    }
    absl::StatusOr<RdmaAccept> accepted = server_.options.rdma_accept(connect->info);
    if (!accepted.ok()) {
      Reject(request_.request_id, v1::TRANSFER_FAIL, accepted.status().message(),
             server_.rejected_malformed);
      return;
    }
    queue_pair_ = std::move(accepted->queue_pair);  // lives as long as this connection
    wire::EncodeRdmaConnect({.granted_opcode = wire::Opcode{0}, .info = accepted->info},
                            rdma_payload_.data());
    wire::EncodeResponse({0, request_.request_id, wire::kRdmaPayloadSize}, response_.data());
    std::array<asio::const_buffer, 2> buffers = {asio::buffer(response_),
                                                 asio::buffer(rdma_payload_)};
    asio::async_write(socket_, buffers,
                      [self = shared_from_this()](boost::system::error_code ec, size_t) {
                        if (!ec) self->ReadHeader();
                      });
  }

  void OnPayload(boost::system::error_code ec, size_t n) {
    if (ec) {
      KVPOOL_LOG(WARNING) << "data connection from " << peer_ << " closed mid-write (" << n
                          << " of " << request_.length << " bytes): " << ec.message();
      return;
    }
    server_.writes.fetch_add(1, std::memory_order_relaxed);
    server_.bytes_written.fetch_add(n, std::memory_order_relaxed);
    server_.write_latency.Observe(absl::Now() - started_);
    Respond(0, 0);
  }

  void SendRead(const uint8_t* range) {
    wire::EncodeResponse({0, request_.request_id, request_.length}, response_.data());
    std::array<asio::const_buffer, 2> buffers = {asio::buffer(response_),
                                                 asio::buffer(range, request_.length)};
    // Counted when the answer starts: a client may have it before the write completes here.
    server_.reads.fetch_add(1, std::memory_order_relaxed);
    server_.bytes_read.fetch_add(request_.length, std::memory_order_relaxed);
    asio::async_write(socket_, buffers,
                      [self = shared_from_this()](boost::system::error_code ec, size_t) {
                        if (ec) return;
                        self->server_.read_latency.Observe(absl::Now() - self->started_);
                        self->ReadHeader();
                      });
  }

  void Respond(int32_t status, uint64_t length) {
    wire::EncodeResponse({status, request_.request_id, length}, response_.data());
    asio::async_write(socket_, asio::buffer(response_),
                      [self = shared_from_this()](boost::system::error_code ec, size_t) {
                        if (!ec) self->ReadHeader();
                      });
  }

  // Answers with an error and the reason, then closes the connection: after a bad frame the
  // stream cannot be trusted to be in step.
  void Reject(uint64_t request_id, int32_t code, absl::string_view reason,
              std::atomic<uint64_t>& counter) {
    counter.fetch_add(1, std::memory_order_relaxed);
    KVPOOL_LOG(WARNING) << "rejected request from " << peer_ << " (" << ErrorCodeName(code)
                        << "): " << reason << "; closing the connection";
    error_message_ = std::string(reason.substr(0, wire::kMaxErrorMessage));
    wire::EncodeResponse({code, request_id, error_message_.size()}, response_.data());
    std::array<asio::const_buffer, 2> buffers = {asio::buffer(response_),
                                                 asio::buffer(error_message_)};
    asio::async_write(socket_, buffers,
                      [self = shared_from_this()](boost::system::error_code, size_t) {
                        boost::system::error_code ignored;
                        self->socket_.shutdown(tcp::socket::shutdown_both, ignored);
                        self->socket_.close(ignored);
                      });
  }

  tcp::socket socket_;
  ServerState& server_;
  std::string peer_;
  std::array<uint8_t, wire::kRequestHeaderSize> header_{};
  std::array<uint8_t, wire::kResponseHeaderSize> response_{};
  wire::RequestHeader request_;
  std::array<uint8_t, wire::kRdmaPayloadSize> rdma_payload_{};
  std::shared_ptr<void> queue_pair_;
  absl::Time started_;
  std::string error_message_;
};

}  // namespace

struct DataServer::Impl {
  Impl(const MemoryPool& pool, std::string secret, DataServerOptions options, Manifest* manifest)
      : state{pool, std::move(secret), options, manifest} {}

  void Accept();

  ServerState state;
  asio::io_context io;
  tcp::acceptor acceptor{io};
  std::vector<std::thread> threads;
};

void DataServer::Impl::Accept() {
  acceptor.async_accept([this](boost::system::error_code ec, tcp::socket socket) {
    if (ec == asio::error::operation_aborted) return;
    if (!ec) {
      boost::system::error_code ignored;
      socket.set_option(tcp::no_delay(true), ignored);
      if (int bytes = state.options.socket_buffer_bytes; bytes > 0) {
        socket.set_option(asio::socket_base::send_buffer_size(bytes), ignored);
        socket.set_option(asio::socket_base::receive_buffer_size(bytes), ignored);
      }
      std::make_shared<Connection>(std::move(socket), state)->Start();
    } else {
      KVPOOL_LOG(WARNING) << "accept failed: " << ec.message();
    }
    Accept();
  });
}

DataServer::DataServer(const MemoryPool& pool, std::string token_secret, DataServerOptions options,
                       Manifest* manifest)
    : impl_(std::make_unique<Impl>(pool, std::move(token_secret), options, manifest)) {}

DataServer::~DataServer() { Stop(); }

absl::StatusOr<uint16_t> DataServer::Start(const std::string& address) {
  absl::StatusOr<uint16_t> port = Listen(impl_->acceptor, address, "data");
  if (!port.ok()) return port.status();
  impl_->Accept();
  for (int i = 0; i < std::max(1, impl_->state.options.threads); ++i) {
    impl_->threads.emplace_back([this] { impl_->io.run(); });
  }
  return port;
}

void DataServer::Stop() {
  if (impl_->threads.empty()) return;
  impl_->io.stop();
  for (std::thread& thread : impl_->threads) thread.join();
  impl_->threads.clear();
}

DataServer::Stats DataServer::stats() const {
  const ServerState& s = impl_->state;
  Stats stats;
  stats.reads = s.reads.load();
  stats.writes = s.writes.load();
  stats.bytes_read = s.bytes_read.load();
  stats.bytes_written = s.bytes_written.load();
  stats.rejected_malformed = s.rejected_malformed.load();
  stats.rejected_range = s.rejected_range.load();
  stats.rejected_token = s.rejected_token.load();
  stats.rejected_expired = s.rejected_expired.load();
  stats.rejected = stats.rejected_malformed + stats.rejected_range + stats.rejected_token +
                   stats.rejected_expired;
  stats.read_latency = s.read_latency.Snapshot();
  stats.write_latency = s.write_latency.Snapshot();
  return stats;
}

}  // namespace kvpool::segment
