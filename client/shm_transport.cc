#include "client/shm_transport.h"

#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "proto/error_codes.h"
#include "proto/shm_handshake.h"

namespace kvpool::client {
namespace {

// Pools up to this size have every page mapped up front (no minor faults on first touch);
// larger ones fault pages in as they are used.
constexpr uint64_t kPopulateLimit = uint64_t{8} << 30;

// Receives exactly `size` bytes, and the fd passed with them if any (else -1).
absl::Status RecvWithFd(int socket, void* data, size_t size, int* fd) {
  *fd = -1;
  size_t got = 0;
  while (got < size) {
    iovec iov{static_cast<char*>(data) + got, size - got};
    msghdr message{};
    message.msg_iov = &iov;
    message.msg_iovlen = 1;
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
    message.msg_control = control;
    message.msg_controllen = sizeof(control);
    ssize_t n = recvmsg(socket, &message, MSG_CMSG_CLOEXEC);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return absl::UnavailableError("shared-memory handshake cut short");
    for (cmsghdr* header = CMSG_FIRSTHDR(&message); header != nullptr;
         header = CMSG_NXTHDR(&message, header)) {
      if (header->cmsg_level == SOL_SOCKET && header->cmsg_type == SCM_RIGHTS) {
        std::memcpy(fd, CMSG_DATA(header), sizeof(int));
      }
    }
    got += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}


// How long an intent's answer may take (the segment answers from one non-blocking thread).
constexpr int kIntentAnswerSeconds = 5;

// Sends `message` and reads one answer of `count` entries on `pool`'s connection. Marks the
// connection broken (and shuts it down, ending its intents at the segment) on any failure.
absl::StatusOr<std::vector<wire::ShmReply>> Exchange(const ShmTransport::Pool& pool,
                                                     const std::string& message, size_t count)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(pool.control_mu) {
  auto fail = [&](absl::string_view why) {
    pool.broken = true;
    if (pool.control >= 0) shutdown(pool.control, SHUT_RDWR);
    return absl::UnavailableError(
        absl::StrCat("shared-memory connection to the segment failed: ", why));
  };
  if (pool.broken || pool.control < 0) return fail("closed earlier");
  size_t sent = 0;
  while (sent < message.size()) {
    ssize_t n = send(pool.control, message.data() + sent, message.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return fail(std::strerror(errno));
    sent += static_cast<size_t>(n);
  }
  std::string answer(wire::kShmMessageHeaderSize + count * wire::kShmReplyEntrySize, '\0');
  size_t got = 0;
  while (got < answer.size()) {
    ssize_t n = recv(pool.control, answer.data() + got, answer.size() - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) return fail("closed by the segment");
    if (n < 0) return fail(errno == EAGAIN ? "no answer in time" : std::strerror(errno));
    got += static_cast<size_t>(n);
  }
  const uint8_t* bytes = reinterpret_cast<const uint8_t*>(answer.data());
  absl::StatusOr<wire::ShmMessageHeader> header = wire::DecodeShmMessageHeader(bytes);
  if (!header.ok() || header->count != count) return fail("malformed answer");
  absl::StatusOr<std::vector<wire::ShmReply>> replies = wire::DecodeShmReplies(
      *header, absl::MakeConstSpan(bytes + wire::kShmMessageHeaderSize, header->body_size));
  if (!replies.ok()) return fail(replies.status().message());
  return replies;
}

}  // namespace

ShmTransport::Pool::~Pool() {
  if (base != nullptr) munmap(base, size);
  if (control >= 0) close(control);
}

absl::StatusOr<std::vector<absl::StatusOr<uint64_t>>> ShmTransport::BeginWrites(
    const Pool& pool, absl::Span<const wire::ShmIntent> intents) {
  std::vector<absl::StatusOr<uint64_t>> results;
  results.reserve(intents.size());
  absl::MutexLock lock(&pool.control_mu);
  for (size_t first = 0; first < intents.size(); first += wire::kShmMaxEntries) {
    absl::Span<const wire::ShmIntent> chunk = intents.subspan(first, wire::kShmMaxEntries);
    absl::StatusOr<std::vector<wire::ShmReply>> replies =
        Exchange(pool, wire::EncodeShmIntents(chunk), chunk.size());
    if (!replies.ok()) return replies.status();  // closed: no intent of it stays open
    for (const wire::ShmReply& reply : *replies) {
      if (reply.status == 0 && reply.intent != 0) {
        results.push_back(reply.intent);
      } else {
        results.push_back(FromErrorCode(
            reply.status != 0 ? reply.status : ErrorCode::INTERNAL_ERROR,
            reply.status == ErrorCode::TRANSFER_FAIL
                ? "the range is busy with a late shared-memory write of an ended grant"
                : "the segment refused the shared-memory write (its grant ended, expired or "
                  "is of another term)"));
      }
    }
  }
  return results;
}

absl::Status ShmTransport::EndWrites(const Pool& pool, absl::Span<const uint64_t> ids) {
  absl::MutexLock lock(&pool.control_mu);
  for (size_t first = 0; first < ids.size(); first += wire::kShmMaxEntries) {
    absl::Span<const uint64_t> chunk = ids.subspan(first, wire::kShmMaxEntries);
    absl::StatusOr<std::vector<wire::ShmReply>> replies =
        Exchange(pool, wire::EncodeShmDone(chunk), chunk.size());
    if (!replies.ok()) return replies.status();
  }
  return absl::OkStatus();
}

void ShmTransport::Forget(const std::string& endpoint, const Pool* pool) {
  absl::MutexLock lock(&mu_);
  auto it = pools_.find(endpoint);
  if (it != pools_.end() && it->second.get() == pool) pools_.erase(it);
}


std::shared_ptr<const ShmTransport::Pool> ShmTransport::Find(const std::string& endpoint,
                                                            uint64_t incarnation) const {
  absl::ReaderMutexLock lock(&mu_);
  auto it = pools_.find(endpoint);
  if (it == pools_.end() || (incarnation != 0 && it->second->incarnation != incarnation)) {
    return nullptr;
  }
  return it->second;
}

std::vector<std::pair<std::string, std::shared_ptr<const ShmTransport::Pool>>> ShmTransport::All()
    const {
  absl::ReaderMutexLock lock(&mu_);
  return {pools_.begin(), pools_.end()};
}

absl::StatusOr<std::shared_ptr<const ShmTransport::Pool>> ShmTransport::Attach(
    const std::string& endpoint, const std::string& socket_path) {
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  if (socket_path.empty() || socket_path.size() >= sizeof(address.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("bad shared-memory socket \"", socket_path, "\""));
  }
  std::memcpy(address.sun_path, socket_path.data(), socket_path.size());
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("socket: ", std::strerror(errno)));
  timeval timeout{2, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    int error = errno;
    close(fd);
    return absl::UnavailableError(
        absl::StrCat("cannot reach ", socket_path, ": ", std::strerror(error)));
  }
  std::string hello = wire::EncodeShmHello();
  if (send(fd, hello.data(), hello.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(hello.size())) {
    close(fd);
    return absl::UnavailableError("shared-memory hello not sent");
  }
  uint8_t fixed[wire::kShmAnswerSize];
  int pool_fd = -1;
  absl::Status received = RecvWithFd(fd, fixed, sizeof(fixed), &pool_fd);
  uint32_t reason_length = 0;
  absl::StatusOr<wire::ShmAnswer> answer =
      received.ok() ? wire::DecodeShmAnswer(fixed, &reason_length) : received;
  if (answer.ok() && reason_length > 0) {
    answer->reason.resize(reason_length);
    if (recv(fd, answer->reason.data(), reason_length, MSG_WAITALL) != reason_length) {
      answer->reason = "(reason cut short)";
    }
  }
  if (!answer.ok()) {
    close(fd);
    if (pool_fd >= 0) close(pool_fd);
    return answer.status();
  }
  if (answer->status != 0 || pool_fd < 0) {
    close(fd);
    if (pool_fd >= 0) close(pool_fd);
    return FromErrorCode(answer->status != 0 ? answer->status : ErrorCode::INTERNAL_ERROR,
                         absl::StrCat("segment ", endpoint, ": ", answer->reason));
  }
  int flags = MAP_SHARED | (answer->pool_size <= kPopulateLimit ? MAP_POPULATE : 0);
  void* base = mmap(nullptr, answer->pool_size, PROT_READ | PROT_WRITE, flags, pool_fd, 0);
  int error = errno;
  close(pool_fd);
  if (base == MAP_FAILED) {
    close(fd);
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot map the pool of ", endpoint, ": ", std::strerror(error)));
  }
  auto pool = std::make_shared<Pool>();
  pool->base = static_cast<uint8_t*>(base);
  pool->size = answer->pool_size;
  pool->incarnation = answer->incarnation;
  // Kept for write intents; their answers come at once, else the connection is given up.
  timeval answer_timeout{kIntentAnswerSeconds, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &answer_timeout, sizeof(answer_timeout));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &answer_timeout, sizeof(answer_timeout));
  pool->control = fd;
  absl::MutexLock lock(&mu_);
  pools_[endpoint] = pool;
  return std::shared_ptr<const Pool>(pool);
}

void ShmTransport::Copy(const Pool& pool, TransferOp& op, absl::Time now) {
  uint64_t expiry_ms;
  std::memcpy(&expiry_ms, op.token.data(), sizeof(expiry_ms));
  if (static_cast<int64_t>(expiry_ms) < absl::ToUnixMillis(now)) {
    op.status = ErrorStatus(ErrorCode::LEASE_EXPIRED,
                            op.opcode == wire::Opcode::kWrite ? "write grant expired"
                                                              : "read grant expired (lease ran out)");
    return;
  }
  if (op.offset > pool.size || op.length > pool.size - op.offset) {
    op.status = ErrorStatus(op.opcode == wire::Opcode::kWrite ? ErrorCode::INVALID_WRITE : ErrorCode::INVALID_READ,
                            "range outside the mapped pool");
    return;
  }
  // Step P2/G2 over shared memory: one memcpy per caller buffer.
  uint8_t* at = pool.base + op.offset;
  for (const iovec& part : op.iov) {
    if (op.opcode == wire::Opcode::kWrite) {
      std::memcpy(at, part.iov_base, part.iov_len);
    } else {
      std::memcpy(part.iov_base, at, part.iov_len);
    }
    at += part.iov_len;
  }
  op.status = absl::OkStatus();
}

}  // namespace kvpool::client
