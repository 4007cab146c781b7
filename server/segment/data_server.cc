#include "server/segment/data_server.h"

#include <sys/socket.h>
#include <sys/uio.h>

#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>

#include <array>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <limits>
#include <memory>
#include <thread>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/log_limiter.h"
#include "proto/capability.h"
#include "proto/checksum.h"
#include "proto/data_tls.h"
#include "proto/error_codes.h"
#include "proto/frame.h"
#include "proto/key_read.h"
#include "proto/rdma_handshake.h"
#include "server/common/listen.h"

namespace kvpool::segment {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

namespace {

// A plain TCP connection's sends as its reads' cuts see them (GrantTable::BeginRead), from
// any thread. Answers go out in rounds (one gathered send each, numbered from 1); a cut of a
// read sent in round r stops what of r is not yet handed to the kernel: a sendmsg under way
// ends first (the cut waits for it: a non-blocking send copies at most the socket's free
// buffer), none begins after it (Send checks `cut_round` once `in_send` is set: of the two
// flags set one after the other, each side sees the other's), and the socket is shut down.
// A round handed to the kernel whole (`round_sent`) is not cut: its bytes have left the pool,
// and the client, which may hold the answer already, keeps its connection.
struct SendState {
  explicit SendState(int fd) : fd(fd) {}
  const int fd;
  std::atomic<uint64_t> round_sent{0};
  std::atomic<uint64_t> cut_round{0};
  std::atomic<bool> in_send{false};

  bool Cut(uint64_t round) {
    uint64_t seen = cut_round.load();
    while (seen < round && !cut_round.compare_exchange_weak(seen, round)) {
    }
    while (in_send.load()) std::this_thread::yield();
    if (round_sent.load() >= round) return false;
    ::shutdown(fd, SHUT_RDWR);  // also wakes a send waiting for room
    return true;
  }
};

// How much of a gathered TLS answer each send may take: as much as the socket's buffer does.
// asio's default (transfer_all) stops every send at 64 KiB, so an answer of 1 MiB of READs
// cost 16 sendmsg calls, each followed by a pass through the event loop.
struct AsMuchAsTheSocketTakes {
  size_t operator()(const boost::system::error_code& ec, size_t) const {
    return ec ? 0 : std::numeric_limits<size_t>::max();
  }
};

// What every connection of a server shares.
struct ServerState {
  ServerState(const MemoryPool& pool, std::string secret, DataServerOptions options)
      : pool(pool), options(options), grants(std::move(secret), options.require_token) {}
  const MemoryPool& pool;
  const DataServerOptions options;
  GrantTable grants;
  std::atomic<uint64_t> reads{0}, writes{0}, bytes_read{0}, bytes_written{0}, key_reads{0},
      key_reads_missed{0};
  std::atomic<uint64_t> rejected_malformed{0}, rejected_range{0}, rejected_token{0},
      rejected_expired{0}, rejected_ended{0}, rejected_busy{0}, rejected_connection_cap{0},
      rejected_handshake{0}, closed_idle{0},
      accept_errors{0};
  std::atomic<int64_t> connections{0};
  LogLimiter reject_log, close_log, accept_log;
  LatencyHistogram read_latency, write_latency;
};

// One client connection. Its requests are handled in order, in rounds: a round takes every
// complete request already received (a client pipelines many), checks each, and answers them
// all with one gathered write (READ data straight from the pool). A WRITE's payload is read
// straight into the pool, but only through GrantTable::Write::Land: once its grant ends no
// further byte lands. At most one asynchronous operation is outstanding, so no strand is
// needed.
//
// With kTls the same over a TLS stream (Boost.Asio ssl): the handshake comes first, under the
// request timeout (a peer that stalls or garbles it is cut off and counted, others are not
// held up); a WRITE's payload is decrypted into a buffer of the connection and copied into
// the pool under Land (the socket's readiness says nothing of what TLS holds decrypted);
// answers are gathered into records of up to 16 KiB.
template <bool kTls>
class Connection : public std::enable_shared_from_this<Connection<kTls>> {
 public:
  using Stream = std::conditional_t<kTls, asio::ssl::stream<tcp::socket>, tcp::socket>;

  // `tls` (kTls only) must outlive the connection: it is held here.
  Connection(tcp::socket socket, ServerState& server, std::shared_ptr<asio::ssl::context> tls)
      : socket_(MakeStream(std::move(socket), tls.get())),
        tls_(std::move(tls)),
        server_(server),
        timer_(socket_.get_executor()) {
    server_.connections.fetch_add(1, std::memory_order_relaxed);
    boost::system::error_code ignored;
    peer_ = absl::StrCat(Socket().remote_endpoint(ignored).address().to_string(ignored), ":",
                         Socket().remote_endpoint(ignored).port());
    answers_.reserve(kMaxAnswers);
    // The payload of a WRITE is read with non-blocking reads under its grant's lock, answers
    // are sent with non-blocking sends (Send).
    if constexpr (!kTls) {
      Socket().non_blocking(true, ignored);
      send_state_ = std::make_shared<SendState>(Socket().native_handle());
    }
  }
  ~Connection() {
    EndReads();
    if (write_) server_.grants.EndWrite(write_);
    server_.connections.fetch_sub(1, std::memory_order_relaxed);
  }

  void Start() {
    if constexpr (kTls) {
      handshaking_ = true;
      Arm(server_.options.request_timeout);
      socket_.async_handshake(asio::ssl::stream_base::server,
                              [self = this->shared_from_this()](boost::system::error_code ec) {
                                self->OnHandshake(ec);
                              });
    } else {
      Receive();
    }
  }

 private:
  // Bytes of requests read ahead; a round answers at most kMaxAnswers requests or
  // kMaxRoundBytes of READ data.
  static constexpr size_t kInputBytes = 16 << 10;
  static constexpr size_t kMaxAnswers = 256;
  static constexpr uint64_t kMaxRoundBytes = 64 << 20;
  // Buffers per sendmsg (as many as Asio's writes took, whose speed this keeps): the client
  // starts on the first answers of a round while the rest is sent.
  static constexpr size_t kSendBuffers = 16;

  struct Answer {
    std::array<uint8_t, wire::kResponseHeaderSize> header;
    const uint8_t* data = nullptr;  // READ data in the pool, or `extra`
    size_t length = 0;
    std::string extra;  // an error reason or an RDMA connect answer
    absl::Time started;
    LatencyHistogram* latency = nullptr;
  };

  static Stream MakeStream(tcp::socket socket, asio::ssl::context* tls) {
    if constexpr (kTls) {
      return Stream(std::move(socket), *tls);
    } else {
      return socket;
    }
  }

  // The TCP socket (under the TLS stream, if any).
  auto& Socket() { return socket_.lowest_layer(); }

  size_t Buffered() const { return end_ - begin_; }

  // A peer that is not a TLS client of this CA (plaintext, a wrong certificate, garbage)
  // fails here; it is counted and closed.
  void OnHandshake(boost::system::error_code ec) {
    handshaking_ = false;
    if (ec) {
      if (ec == asio::error::operation_aborted) return;  // cut off by the timer
      server_.rejected_handshake.fetch_add(1, std::memory_order_relaxed);
      uint64_t suppressed = 0;
      if (server_.reject_log.Allow(&suppressed)) {
        KVPOOL_LOG(WARNING) << "TLS handshake with " << peer_ << " failed: " << ec.message()
                            << "; closing the connection" << SuppressedNote(suppressed);
      }
      boost::system::error_code ignored;
      Socket().close(ignored);
      return;
    }
    Receive();
  }

  // Closes the connection when `timeout` passes before the next Arm: idle between requests,
  // or a request (header, WRITE payload, answers) not done in time. Handlers of one
  // connection run on its strand, so this never races a read or write.
  void Arm(absl::Duration timeout) {
    timer_.expires_after(absl::ToChronoNanoseconds(timeout));
    timer_.async_wait([weak = this->weak_from_this(), timeout](boost::system::error_code ec) {
      std::shared_ptr<Connection> self = weak.lock();
      if (ec || self == nullptr) return;
      self->server_.closed_idle.fetch_add(1, std::memory_order_relaxed);
      uint64_t suppressed = 0;
      if (self->server_.close_log.Allow(&suppressed)) {
        KVPOOL_LOG(WARNING) << "closing data connection from " << self->peer_ << ": "
                            << (self->handshaking_ ? "TLS handshake not done"
                                : self->Buffered() == 0 && !self->write_ ? "idle"
                                                                          : "a request not done")
                            << " for " << timeout << SuppressedNote(suppressed);
      }
      self->EndReads();  // before the descriptor can be reused
      boost::system::error_code ignored;
      self->Socket().close(ignored);
    });
  }

  void Receive() {
    // Between requests the idle timeout runs; once a header has begun, the request timeout
    // (armed once per request, so a trickle of bytes does not extend it).
    if (Buffered() == 0) {
      request_armed_ = false;
      Arm(server_.options.idle_timeout);
    } else if (!request_armed_) {
      request_armed_ = true;
      Arm(server_.options.request_timeout);
    }
    if (begin_ > 0) {
      std::memmove(input_.data(), input_.data() + begin_, Buffered());
      end_ -= begin_;
      begin_ = 0;
    }
    socket_.async_read_some(
        asio::buffer(input_.data() + end_, input_.size() - end_),
        [self = this->shared_from_this()](boost::system::error_code ec, size_t n) {
          self->OnReceive(ec, n);
        });
  }

  void OnReceive(boost::system::error_code ec, size_t n) {
    if (ec) {
      uint64_t suppressed = 0;
      // A TLS client that closes without close_notify between requests is a normal close too.
      bool closed = ec == asio::error::eof || ec == asio::ssl::error::stream_truncated;
      if ((!closed || Buffered() != 0) && ec != asio::error::operation_aborted &&
          server_.close_log.Allow(&suppressed)) {
        KVPOOL_LOG(WARNING) << "data connection from " << peer_ << " closed mid-request ("
                            << Buffered() << " bytes of a request): " << ec.message()
                            << SuppressedNote(suppressed);
      }
      return;
    }
    end_ += n;
    Process();
  }

  // Handles every complete request buffered, then answers them or reads more.
  void Process() {
    uint64_t round_bytes = 0;
    while (Buffered() >= wire::kRequestHeaderSize && answers_.size() < kMaxAnswers &&
           round_bytes < kMaxRoundBytes && !closing_) {
      const uint8_t* header = input_.data() + begin_;
      absl::StatusOr<wire::RequestHeader> request = wire::DecodeRequest(header);
      if (!request.ok()) {
        Reject(0, v1::INVALID_PARAMS, absl::StrCat("malformed frame: ", request.status().message()),
               server_.rejected_malformed);
        break;
      }
      request_ = *request;
      if (request_.opcode == wire::Opcode::kRdmaConnect) {
        if (Buffered() < wire::kRequestHeaderSize + wire::kRdmaPayloadSize) break;  // need more
        begin_ += wire::kRequestHeaderSize;
        RdmaConnect(input_.data() + begin_);
        begin_ += wire::kRdmaPayloadSize;
        continue;
      }
      if (request_.opcode == wire::Opcode::kReadKey) {
        // The tenant and the key follow the header; both are bounded, so they fit the input
        // buffer whole.
        if (request_.flags > wire::kMaxKeyReadTenant || request_.length <= request_.flags ||
            request_.length - request_.flags > wire::kMaxKeyReadKey) {
          Reject(request_.request_id, v1::INVALID_PARAMS,
                 absl::StrCat("READ_KEY of a ", request_.flags, "-byte tenant and a ",
                              request_.length - std::min<uint64_t>(request_.length, request_.flags),
                              "-byte key (at most ", wire::kMaxKeyReadTenant, " and 1 to ",
                              wire::kMaxKeyReadKey, ")"),
                 server_.rejected_malformed);
          break;
        }
        if (Buffered() < wire::kRequestHeaderSize + request_.length) break;  // need more
        begin_ += wire::kRequestHeaderSize;
        const char* payload = reinterpret_cast<const char*>(input_.data() + begin_);
        begin_ += request_.length;
        round_bytes +=
            ReadKey(absl::string_view(payload, request_.flags),
                    absl::string_view(payload + request_.flags, request_.length - request_.flags));
        continue;
      }
      begin_ += wire::kRequestHeaderSize;
      if (request_.opcode == wire::Opcode::kPing) {
        Queue(0, nullptr, 0, nullptr);
        continue;
      }
      // Step P2/G2 (segment side): check the range and the capability before any byte moves.
      if (!Check()) break;
      uint8_t* range = server_.pool.data() + request_.offset;
      if (request_.opcode == wire::Opcode::kRead) {
        // Counted when the answer is queued: a client may have it before the write completes.
        // In flight (reads_) until the answer is sent: ending its grant cuts the send.
        server_.reads.fetch_add(1, std::memory_order_relaxed);
        server_.bytes_read.fetch_add(request_.length, std::memory_order_relaxed);
        Queue(0, range, request_.length, &server_.read_latency);
        round_bytes += request_.length;
        continue;
      }
      // WRITE: what of the payload is buffered is copied; the rest is read straight in.
      write_started_ = absl::Now();
      if (!request_armed_) Arm(server_.options.request_timeout);
      request_armed_ = false;  // the next request arms its own
      written_ = std::min<uint64_t>(Buffered(), request_.length);
      const uint8_t* buffered = input_.data() + begin_;
      begin_ += written_;
      hash_.Reset();
      if (!write_->Land([&] {
            std::memcpy(range, buffered, written_);
            if (hash_writes_) hash_.Update(range, written_);
          })) {
        GrantEnded();
        break;
      }
      if (written_ < request_.length) {
        AwaitPayload();
        return;
      }
      WriteDone(request_.length);
    }
    if (!answers_.empty()) {
      Flush();
    } else if (!closing_) {
      Receive();
    }
  }

  void AwaitPayload() {
    if constexpr (kTls) {
      if (tls_payload_.empty()) tls_payload_.resize(kTlsPayloadBytes);
      size_t want = std::min<uint64_t>(tls_payload_.size(), request_.length - written_);
      socket_.async_read_some(asio::buffer(tls_payload_.data(), want),
                              [self = this->shared_from_this()](boost::system::error_code ec,
                                                                size_t n) {
                                self->OnTlsPayload(ec, n);
                              });
    } else {
      Socket().async_wait(tcp::socket::wait_read,
                          [self = this->shared_from_this()](boost::system::error_code ec) {
                            self->OnReadable(ec);
                          });
    }
  }

  // TLS: `n` decrypted bytes of the payload are in tls_payload_; they land while the grant
  // is open.
  void OnTlsPayload(boost::system::error_code ec, size_t n) {
    if (n > 0) {
      uint8_t* range = server_.pool.data() + request_.offset + written_;
      bool landed = write_->Land([&] {
        std::memcpy(range, tls_payload_.data(), n);
        if (hash_writes_) hash_.Update(range, n);
      });
      if (!landed) {
        GrantEnded();
        Flush();
        return;
      }
      written_ += n;
    }
    if (ec && written_ < request_.length) {
      PayloadBroken(ec);
      return;
    }
    if (written_ < request_.length) {
      AwaitPayload();
      return;
    }
    WriteDone(request_.length);
    Process();
  }

  void PayloadBroken(boost::system::error_code ec) {
    uint64_t suppressed = 0;
    if (server_.close_log.Allow(&suppressed)) {
      KVPOOL_LOG(WARNING) << "data connection from " << peer_ << " closed mid-write (" << written_
                          << " of " << request_.length << " bytes): " << ec.message()
                          << SuppressedNote(suppressed);
    }
    server_.grants.EndWrite(write_);
    write_.reset();
  }

  // Moves what has arrived of the payload into the pool, while the grant is open.
  void OnReadable(boost::system::error_code ec) {
    uint8_t* range = server_.pool.data() + request_.offset;
    while (!ec && written_ < request_.length) {
      size_t n = 0;
      bool landed = write_->Land([&] {
        n = socket_.read_some(asio::buffer(range + written_, request_.length - written_), ec);
        // Hashed while the bytes the kernel just copied are in this core's cache.
        if (hash_writes_ && n > 0) hash_.Update(range + written_, n);
      });
      if (!landed) {
        GrantEnded();
        Flush();
        return;
      }
      if (ec == asio::error::would_block || ec == asio::error::try_again) {
        AwaitPayload();
        return;
      }
      written_ += n;
    }
    if (ec) {
      PayloadBroken(ec);
      return;
    }
    WriteDone(request_.length);
    Process();
  }

  // The write's grant ended (or its token expired) while its payload arrived: what came
  // after that was not stored. The stream is not in step any more: answer and close.
  void GrantEnded() {
    server_.grants.EndWrite(write_);
    write_.reset();
    Reject(request_.request_id, v1::PERMISSION_DENIED,
           absl::StrCat("the write's grant ended (revoked, reclaimed, expired or a new master "
                        "term) after ", written_, " of ", request_.length,
                        " bytes; the rest was not stored"),
           server_.rejected_ended);
  }

  void WriteDone(size_t n) {
    std::optional<GrantTable::Landed> landed;
    if (hash_writes_) landed = GrantTable::Landed{request_.offset, n, hash_.Digest()};
    server_.grants.EndWrite(write_, landed);
    write_.reset();
    server_.writes.fetch_add(1, std::memory_order_relaxed);
    server_.bytes_written.fetch_add(n, std::memory_order_relaxed);
    server_.write_latency.Observe(absl::Now() - write_started_);
    Queue(0, nullptr, 0, nullptr);
  }

  // The range lies in the pool and the token grants it; else the request is rejected.
  bool Check() {
    bool write = request_.opcode == wire::Opcode::kWrite;
    if (!server_.pool.Contains(request_.offset, request_.length)) {
      Reject(request_.request_id, write ? v1::INVALID_WRITE : v1::INVALID_READ,
             absl::StrCat("range [", request_.offset, ", +", request_.length,
                          ") is outside the pool of ", server_.pool.size(), " bytes"),
             server_.rejected_range);
      return false;
    }
    absl::Status granted;
    if (write) {
      absl::StatusOr<std::shared_ptr<GrantTable::Write>> begun =
          server_.grants.BeginWrite(request_, absl::Now());
      granted = begun.status();
      if (begun.ok()) write_ = *std::move(begun);
    } else {
      // Should the grant end while the answer is sent straight from the pool, the send is cut
      // (CutOfRound): no byte leaves the range after the segment applied the end.
      absl::StatusOr<uint64_t> read = server_.grants.BeginRead(request_, absl::Now(), CutOfRound());
      granted = read.status();
      if (read.ok()) reads_.push_back(*read);
    }
    if (granted.ok()) return true;
    bool expired = granted.code() == absl::StatusCode::kDeadlineExceeded;
    bool ended = granted.code() == absl::StatusCode::kFailedPrecondition;
    if (granted.code() == absl::StatusCode::kUnavailable) {
      // The range is busy with a late shared-memory write of an ended grant: put again.
      Reject(request_.request_id, v1::TRANSFER_FAIL, granted.message(), server_.rejected_busy);
      return false;
    }
    Reject(request_.request_id, expired ? v1::LEASE_EXPIRED : v1::PERMISSION_DENIED,
           absl::StrCat(granted.message(),
                        expired ? (write ? " (reservation timed out)" : " (lease ran out)") : ""),
           expired ? server_.rejected_expired
                   : ended ? server_.rejected_ended
                           : server_.rejected_token);
    return false;
  }

  // READ_KEY: answers the manifest's entry for the tenant's key, straight from the pool, with
  // its writer's checksum; OBJECT_NOT_FOUND (connection kept) when this segment holds no such
  // entry or may not serve reads by key now, BUFFER_OVERFLOW (kept) when the value is larger
  // than the client takes. Returns the bytes queued.
  uint64_t ReadKey(absl::string_view tenant, absl::string_view key) {
    absl::Time now = absl::Now();
    if (tenant.empty() && key.front() == wire::kTenantMarker) {
      Reject(request_.request_id, v1::PERMISSION_DENIED,
             "keys beginning with byte 0x1e name tenants' namespaces", server_.rejected_token);
      return 0;
    }
    absl::Status credential = server_.grants.CheckKeyReadCredential(request_.token, tenant, now);
    if (!credential.ok()) {
      bool expired = credential.code() == absl::StatusCode::kDeadlineExceeded;
      Reject(request_.request_id, expired ? v1::LEASE_EXPIRED : v1::PERMISSION_DENIED,
             credential.message(), expired ? server_.rejected_expired : server_.rejected_token);
      return 0;
    }
    Manifest* manifest = server_.options.manifest;
    if (manifest == nullptr ||
        (server_.options.key_reads_allowed && !server_.options.key_reads_allowed(now))) {
      return KeyMissed("this segment serves no reads by key now; ask the master");
    }
    std::string stored = wire::TenantKey(tenant, key);
    std::optional<Manifest::Found> found = manifest->Find(stored);
    if (!found.has_value() || found->checksum == 0 ||
        !server_.pool.Contains(found->offset, found->size)) {
      return KeyMissed("no such object on this segment");
    }
    if (found->size > request_.offset) {
      return KeyMissed(absl::StrCat("the value has ", found->size, " bytes, more than the ",
                                    request_.offset, " asked for"),
                       v1::BUFFER_OVERFLOW);
    }
    // In flight before the entry is checked again: should it leave the manifest after this
    // check, the send is cut (GrantTable::CutKeyReads); if it left before, nothing is sent.
    uint64_t read = server_.grants.BeginKeyRead(found->offset, found->size, CutOfRound());
    if (!manifest->Holds(stored, *found)) {
      server_.grants.EndRead(read);
      return KeyMissed("no such object on this segment");
    }
    reads_.push_back(read);
    manifest->NoteRead(stored);
    server_.key_reads.fetch_add(1, std::memory_order_relaxed);
    server_.bytes_read.fetch_add(found->size, std::memory_order_relaxed);
    Queue(0, server_.pool.data() + found->offset, found->size, &server_.read_latency,
          found->checksum);
    return found->size;
  }

  // A READ_KEY answered without the value, on a kept connection.
  uint64_t KeyMissed(std::string reason, int32_t status = v1::OBJECT_NOT_FOUND) {
    server_.key_reads_missed.fetch_add(1, std::memory_order_relaxed);
    QueueExtra(status, std::move(reason));
    return 0;
  }

  // A client asks for a queue pair; it must hold a grant of this segment (any range).
  void RdmaConnect(const uint8_t* payload) {
    absl::StatusOr<wire::RdmaConnect> connect = wire::DecodeRdmaConnect(payload, /*answer=*/false);
    if (!connect.ok()) {
      Reject(request_.request_id, v1::INVALID_PARAMS, connect.status().message(),
             server_.rejected_malformed);
      return;
    }
    wire::RequestHeader grant = request_;
    grant.opcode = connect->granted_opcode;
    if (server_.options.require_token) {
      absl::Status granted = server_.grants.CheckRead(grant, absl::Now());
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
    std::string answer(wire::kRdmaPayloadSize, '\0');
    wire::EncodeRdmaConnect({.granted_opcode = wire::Opcode{0}, .info = accepted->info},
                            reinterpret_cast<uint8_t*>(answer.data()));
    QueueExtra(0, std::move(answer));
  }

  void Queue(int32_t status, const uint8_t* data, size_t length, LatencyHistogram* latency,
             uint64_t checksum = 0) {
    Answer& answer = answers_.emplace_back();
    wire::EncodeResponse({status, request_.request_id, length, checksum}, answer.header.data());
    answer.data = data;
    answer.length = length;
    answer.started = absl::Now();
    answer.latency = latency;
  }

  void QueueExtra(int32_t status, std::string extra) {
    Queue(status, nullptr, extra.size(), nullptr);
    Answer& answer = answers_.back();
    answer.extra = std::move(extra);
  }

  // Answers with an error and the reason, then closes the connection: after a bad frame the
  // stream cannot be trusted to be in step. Requests before it are answered first.
  void Reject(uint64_t request_id, int32_t code, absl::string_view reason,
              std::atomic<uint64_t>& counter) {
    counter.fetch_add(1, std::memory_order_relaxed);
    uint64_t suppressed = 0;
    if (server_.reject_log.Allow(&suppressed)) {
      KVPOOL_LOG(WARNING) << "rejected request from " << peer_ << " (" << ErrorCodeName(code)
                          << "): " << reason << "; closing the connection"
                          << SuppressedNote(suppressed);
    }
    request_.request_id = request_id;
    QueueExtra(code, std::string(reason.substr(0, wire::kMaxErrorMessage)));
    closing_ = true;
  }

  // How GrantTable stops the send of a read queued in this round.
  GrantTable::Cut CutOfRound() {
    if constexpr (kTls) {
      return [fd = Socket().native_handle()] {
        ::shutdown(fd, SHUT_RDWR);
        return true;
      };
    } else {
      return [state = send_state_, round = round_] { return state->Cut(round); };
    }
  }

  // One gathered write of every queued answer (a round).
  void Flush() {
    Arm(server_.options.request_timeout);  // a peer that does not read its answers is cut off
    request_armed_ = false;
    gather_.clear();
    if constexpr (kTls) {
      GatherRecords();
      asio::async_write(socket_, gather_, AsMuchAsTheSocketTakes{},
                        [self = this->shared_from_this()](boost::system::error_code ec, size_t) {
                          self->OnFlushed(ec);
                        });
    } else {
      for (const Answer& answer : answers_) {
        gather_.push_back(asio::buffer(answer.header));
        if (answer.length == 0) continue;
        gather_.push_back(answer.extra.empty() ? asio::buffer(answer.data, answer.length)
                                               : asio::buffer(answer.extra));
      }
      unsent_ = 0;
      Send();
    }
  }

  // Plain TCP: sends what is left of the round as far as the socket takes it, then waits for
  // room. The round's reads may be cut meanwhile, from another thread (SendState).
  void Send() {
    SendState& state = *send_state_;
    for (;;) {
      iov_.clear();
      for (size_t i = unsent_; i < gather_.size() && iov_.size() < kSendBuffers; ++i) {
        iov_.push_back(iovec{const_cast<void*>(gather_[i].data()), gather_[i].size()});
      }
      msghdr message{};
      message.msg_iov = iov_.data();
      message.msg_iovlen = iov_.size();
      state.in_send.store(true);
      if (state.cut_round.load() >= round_) {
        state.in_send.store(false);
        OnFlushed(asio::error::connection_aborted);
        return;
      }
      ssize_t sent = ::sendmsg(state.fd, &message, MSG_NOSIGNAL);
      int error = errno;
      bool done = sent > 0 && Consume(static_cast<size_t>(sent));
      if (done) state.round_sent.store(round_);
      state.in_send.store(false);
      if (done) {
        // Not OnFlushed here: it goes on with the next round, which may end here again. A
        // continuation (defer) takes the loop's own queue, no lock and no wake-up.
        asio::defer(socket_.get_executor(),
                    [self = this->shared_from_this()] { self->OnFlushed({}); });
        return;
      }
      if (sent > 0 || (sent < 0 && error == EINTR)) continue;
      if (sent < 0 && (error == EAGAIN || error == EWOULDBLOCK)) {
        Socket().async_wait(tcp::socket::wait_write,
                            [self = this->shared_from_this()](boost::system::error_code ec) {
                              if (ec) {
                                self->OnFlushed(ec);
                              } else {
                                self->Send();
                              }
                            });
        return;
      }
      OnFlushed(
          boost::system::error_code(sent < 0 ? error : EIO, boost::system::system_category()));
      return;
    }
  }

  // Drops `n` sent bytes from the front of the round; whether none is left.
  bool Consume(size_t n) {
    while (n > 0) {
      asio::const_buffer& front = gather_[unsent_];
      if (n < front.size()) {
        front += n;
        return false;
      }
      n -= front.size();
      ++unsent_;
    }
    return unsent_ == gather_.size();
  }

  // TLS writes one record per buffer: headers and small answers are copied together into
  // runs of up to kRecordBytes, large READ data is sent from the pool.
  void GatherRecords() {
    auto small = [](size_t length) { return length < kRecordBytes / 4; };
    size_t copied = 0;
    for (const Answer& answer : answers_) {
      copied += answer.header.size() + (small(answer.length) ? answer.length : 0);
    }
    tls_out_.clear();
    tls_out_.reserve(copied);  // no reallocation below: the buffers point into it
    size_t run = 0;            // where the run being gathered begins in tls_out_
    auto end_run = [&] {
      if (tls_out_.size() > run) gather_.push_back(asio::buffer(tls_out_.data() + run,
                                                               tls_out_.size() - run));
      run = tls_out_.size();
    };
    auto copy = [&](const uint8_t* data, size_t length) {
      if (tls_out_.size() - run + length > kRecordBytes) end_run();
      tls_out_.insert(tls_out_.end(), data, data + length);
    };
    for (const Answer& answer : answers_) {
      copy(answer.header.data(), answer.header.size());
      if (answer.length == 0) continue;
      const uint8_t* data = answer.extra.empty()
                                ? answer.data
                                : reinterpret_cast<const uint8_t*>(answer.extra.data());
      if (small(answer.length)) {
        copy(data, answer.length);
      } else {
        end_run();
        gather_.push_back(asio::buffer(data, answer.length));
      }
    }
    end_run();
  }

  // The reads of the last round are sent (or the connection failed): their grants may end.
  void EndReads() {
    for (uint64_t read : reads_) server_.grants.EndRead(read);
    reads_.clear();
  }

  void OnFlushed(boost::system::error_code ec) {
    EndReads();
    ++round_;
    absl::Time now = absl::Now();
    for (const Answer& answer : answers_) {
      if (answer.latency != nullptr) answer.latency->Observe(now - answer.started);
    }
    answers_.clear();
    if (ec) return;
    if (closing_) {
      boost::system::error_code ignored;
      Socket().shutdown(tcp::socket::shutdown_both, ignored);
      Socket().close(ignored);
      return;
    }
    Process();
  }

  // TLS: decrypted WRITE payload on its way into the pool; gathered answers.
  static constexpr size_t kTlsPayloadBytes = 256 << 10;
  static constexpr size_t kRecordBytes = 16 << 10;

  Stream socket_;
  const std::shared_ptr<asio::ssl::context> tls_;
  std::vector<uint8_t> tls_payload_;
  std::vector<uint8_t> tls_out_;
  bool handshaking_ = false;
  ServerState& server_;
  std::string peer_;
  std::array<uint8_t, kInputBytes> input_{};
  size_t begin_ = 0;
  size_t end_ = 0;
  wire::RequestHeader request_;
  // The WRITE whose payload is arriving, and how much of it has landed.
  std::shared_ptr<GrantTable::Write> write_;
  uint64_t written_ = 0;
  // The checksum of what of write_ has landed so far.
  const bool hash_writes_ = server_.options.checksum_writes;
  wire::ChecksumStream hash_;
  absl::Time write_started_;
  std::vector<Answer> answers_;
  // Reads whose answers are queued or being sent (GrantTable::BeginRead).
  std::vector<uint64_t> reads_;
  std::vector<asio::const_buffer> gather_;
  // Plain TCP: the first buffer of gather_ not wholly sent, the buffers of a sendmsg, the
  // round being queued or sent (from 1), and what cuts of its reads see (SendState).
  size_t unsent_ = 0;
  std::vector<iovec> iov_;
  uint64_t round_ = 1;
  std::shared_ptr<SendState> send_state_;
  std::shared_ptr<void> queue_pair_;
  bool closing_ = false;
  asio::steady_timer timer_;
  bool request_armed_ = false;
};

}  // namespace

struct DataServer::Impl {
  Impl(const MemoryPool& pool, std::string secret, DataServerOptions options)
      : state(pool, std::move(secret), options),
        loops(MakeLoops(options.threads)),
        acceptor(*loops[0]),
        backoff(*loops[0]) {}

  static std::vector<std::unique_ptr<asio::io_context>> MakeLoops(int threads) {
    std::vector<std::unique_ptr<asio::io_context>> loops;
    for (int i = 0; i < std::max(1, threads); ++i) {
      loops.push_back(std::make_unique<asio::io_context>());
    }
    return loops;
  }

  void Accept();
  // The Asio context for the next TLS connection: TlsContextSource's current one (a new
  // wrapper only when that changed, after a certificate rotation).
  std::shared_ptr<asio::ssl::context> TlsContext();

  ServerState state;
  std::shared_ptr<TlsContextSource> tls;
  std::shared_ptr<SSL_CTX> tls_native;  // what tls_context wraps
  std::shared_ptr<asio::ssl::context> tls_context;
  // One event loop per data-plane thread, each watching its own sockets, and connections
  // dealt round-robin over them. (With one loop shared by every thread, the thread that took
  // a connection's request sent its whole answer while no thread watched the other sockets:
  // two connections' answers went out one after the other, not side by side.) The acceptor
  // runs on the first loop.
  std::vector<std::unique_ptr<asio::io_context>> loops;
  size_t next_loop = 0;  // the acceptor's handler alone uses it
  tcp::acceptor acceptor;
  asio::steady_timer backoff;
  std::vector<std::thread> threads;
};

void DataServer::Impl::Accept() {
  // Each connection gets its own strand: its handlers (reads, writes, its timer) never run
  // at the same time.
  asio::io_context& loop = *loops[next_loop++ % loops.size()];
  acceptor.async_accept(asio::make_strand(loop), [this](boost::system::error_code ec,
                                                        tcp::socket socket) {
    if (ec == asio::error::operation_aborted) return;
    uint64_t suppressed = 0;
    if (ec) {
      // EMFILE and the like: the failure repeats at once while the cause lasts, so back off
      // instead of spinning (and logging) in a tight loop.
      state.accept_errors.fetch_add(1, std::memory_order_relaxed);
      if (state.accept_log.Allow(&suppressed)) {
        KVPOOL_LOG(WARNING) << "accept failed: " << ec.message() << "; backing off"
                            << SuppressedNote(suppressed);
      }
      backoff.expires_after(std::chrono::milliseconds(50));
      backoff.async_wait([this](boost::system::error_code waited) {
        if (!waited) Accept();
      });
      return;
    }
    if (state.connections.load(std::memory_order_relaxed) >= state.options.max_connections) {
      state.rejected_connection_cap.fetch_add(1, std::memory_order_relaxed);
      if (state.accept_log.Allow(&suppressed)) {
        KVPOOL_LOG(WARNING) << "refused a data connection: " << state.options.max_connections
                            << " are open (--max-connections)" << SuppressedNote(suppressed);
      }
      boost::system::error_code ignored;
      socket.close(ignored);
    } else {
      boost::system::error_code ignored;
      socket.set_option(tcp::no_delay(true), ignored);
      if (int bytes = state.options.socket_buffer_bytes; bytes > 0) {
        socket.set_option(asio::socket_base::send_buffer_size(bytes), ignored);
        socket.set_option(asio::socket_base::receive_buffer_size(bytes), ignored);
      }
      // Started on its own loop's thread.
      auto start = [executor = socket.get_executor()](auto connection) {
        asio::post(executor, [connection] { connection->Start(); });
      };
      if (tls != nullptr) {
        start(std::make_shared<Connection<true>>(std::move(socket), state, TlsContext()));
      } else {
        start(std::make_shared<Connection<false>>(std::move(socket), state, nullptr));
      }
    }
    Accept();
  });
}

std::shared_ptr<asio::ssl::context> DataServer::Impl::TlsContext() {
  std::shared_ptr<SSL_CTX> current = tls->Current();
  if (current != tls_native) {
    SSL_CTX_up_ref(current.get());  // the Asio context frees its reference
    tls_context = std::make_shared<asio::ssl::context>(current.get());
    tls_native = std::move(current);
  }
  return tls_context;
}

DataServer::DataServer(const MemoryPool& pool, std::string token_secret, DataServerOptions options)
    : impl_(std::make_unique<Impl>(pool, std::move(token_secret), options)) {}

GrantTable& DataServer::grants() { return impl_->state.grants; }
const GrantTable& DataServer::grants() const { return impl_->state.grants; }

DataServer::~DataServer() { Stop(); }

absl::StatusOr<uint16_t> DataServer::Start(const std::string& address) {
  if (const std::optional<ServerTlsOptions>& options = impl_->state.options.tls) {
    absl::StatusOr<std::shared_ptr<TlsContextSource>> tls = TlsContextSource::ForServer(*options);
    if (!tls.ok()) return tls.status();
    impl_->tls = *std::move(tls);
  }
  absl::StatusOr<uint16_t> port = Listen(impl_->acceptor, address, "data");
  if (!port.ok()) return port.status();
  impl_->Accept();
  for (std::unique_ptr<asio::io_context>& loop : impl_->loops) {
    impl_->threads.emplace_back([loop = loop.get()] {
      // Runs until Stop, with or without connections.
      auto work = asio::make_work_guard(*loop);
      loop->run();
    });
  }
  return port;
}

void DataServer::Stop() {
  if (impl_->threads.empty()) return;
  for (std::unique_ptr<asio::io_context>& loop : impl_->loops) loop->stop();
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
  stats.key_reads = s.key_reads.load();
  stats.key_reads_missed = s.key_reads_missed.load();
  stats.rejected_malformed = s.rejected_malformed.load();
  stats.rejected_range = s.rejected_range.load();
  stats.rejected_token = s.rejected_token.load();
  stats.rejected_expired = s.rejected_expired.load();
  stats.rejected_ended = s.rejected_ended.load();
  stats.rejected_busy = s.rejected_busy.load();
  stats.rejected_connection_cap = s.rejected_connection_cap.load();
  stats.closed_idle = s.closed_idle.load();
  stats.accept_errors = s.accept_errors.load();
  stats.rejected_handshake = s.rejected_handshake.load();
  stats.connections = static_cast<uint64_t>(std::max<int64_t>(0, s.connections.load()));
  stats.rejected = stats.rejected_malformed + stats.rejected_range + stats.rejected_token +
                   stats.rejected_expired + stats.rejected_ended + stats.rejected_busy +
                   stats.rejected_connection_cap + stats.rejected_handshake;
  stats.read_latency = s.read_latency.Snapshot();
  stats.write_latency = s.write_latency.Snapshot();
  return stats;
}

}  // namespace kvpool::segment
