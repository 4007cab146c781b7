#include "client/tools/bench/io.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "client/socket_io.h"

namespace kvpool::bench {

Buffer::Buffer(size_t bytes, uint8_t seed) : size_(bytes) {
  if (bytes == 0) return;
  void* data = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (data == MAP_FAILED) {
    std::fprintf(stderr, "kvpool-bench: cannot map %zu bytes: %s\n", bytes, std::strerror(errno));
    std::abort();
  }
  data_ = static_cast<uint8_t*>(data);
  // Every page touched, and not all zeros.
  std::memset(data_, seed, bytes);
  for (size_t i = 0; i < bytes; i += 4096) data_[i] = static_cast<uint8_t>(seed + i / 4096);
}

Buffer::~Buffer() {
  if (data_ != nullptr) munmap(data_, size_);
}

Buffer::Buffer(Buffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) munmap(data_, size_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

SlotRing::SlotRing(uint64_t bytes, uint64_t value_size, int unit, uint8_t seed)
    : value_size_(value_size), unit_(static_cast<size_t>(std::max(1, unit))) {
  size_t units = std::max<size_t>(1, bytes / (value_size * unit_));
  slots_ = units * unit_;
  buffer_ = Buffer(slots_ * value_size, seed);
}

size_t SlotRing::NextUnit() {
  size_t first = next_;
  next_ = (next_ + unit_) % slots_;
  return first;
}

absl::StatusOr<int> ListenLoopback(uint16_t* port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("socket: ", std::strerror(errno)));
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
      listen(fd, 128) != 0) {
    int error = errno;
    close(fd);
    return absl::UnavailableError(absl::StrCat("listen on 127.0.0.1:0: ", std::strerror(error)));
  }
  socklen_t length = sizeof(address);
  getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  *port = ntohs(address.sin_port);
  return fd;
}

absl::StatusOr<uint16_t> FreeLoopbackPort() {
  uint16_t port = 0;
  absl::StatusOr<int> fd = ListenLoopback(&port);
  if (!fd.ok()) return fd.status();
  close(*fd);
  return port;
}

void SetSocketOptions(int fd, int buffer_bytes) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  if (buffer_bytes > 0) {
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buffer_bytes, sizeof(buffer_bytes));
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buffer_bytes, sizeof(buffer_bytes));
  }
}

absl::StatusOr<int> ConnectBlocking(const std::string& host, uint16_t port, int buffer_bytes) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
  if (rc != 0) {
    return absl::UnavailableError(absl::StrCat("cannot resolve ", host, ": ", gai_strerror(rc)));
  }
  absl::Status last = absl::UnavailableError(absl::StrCat("no address for ", host));
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    SetSocketOptions(fd, buffer_bytes);
    if (connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
      freeaddrinfo(found);
      return fd;
    }
    last = absl::UnavailableError(
        absl::StrCat("connect to ", host, ":", port, ": ", std::strerror(errno)));
    close(fd);
  }
  freeaddrinfo(found);
  return last;
}

absl::Status WriteAll(int fd, absl::Span<iovec> iov) {
  size_t first = client::AdvanceIov(iov, 0, 0);
  while (first < iov.size()) {
    msghdr message{};
    message.msg_iov = &iov[first];
    message.msg_iovlen = std::min<size_t>(iov.size() - first, IOV_MAX);
    ssize_t n = sendmsg(fd, &message, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return absl::UnavailableError(absl::StrCat("send: ", std::strerror(errno)));
    first = client::AdvanceIov(iov, first, static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

absl::Status ReadAll(int fd, absl::Span<iovec> iov) {
  size_t first = client::AdvanceIov(iov, 0, 0);
  while (first < iov.size()) {
    ssize_t n =
        readv(fd, &iov[first], static_cast<int>(std::min<size_t>(iov.size() - first, IOV_MAX)));
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) return absl::UnavailableError("connection closed by the peer");
    if (n < 0) return absl::UnavailableError(absl::StrCat("receive: ", std::strerror(errno)));
    first = client::AdvanceIov(iov, first, static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

absl::Status WriteAll(int fd, const void* data, size_t size) {
  iovec iov{const_cast<void*>(data), size};
  return WriteAll(fd, absl::MakeSpan(&iov, 1));
}

absl::Status ReadAll(int fd, void* data, size_t size) {
  iovec iov{data, size};
  return ReadAll(fd, absl::MakeSpan(&iov, 1));
}

}  // namespace kvpool::bench
