#include "client/socket_io.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/net.h"

namespace kvpool::client {

absl::Status WaitReady(int fd, short events, absl::Time deadline) {
  while (true) {
    absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) return absl::DeadlineExceededError("data transfer timed out");
    pollfd p{fd, events, 0};
    int timeout_ms = static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(left) + 1, INT_MAX));
    int n = poll(&p, 1, timeout_ms);
    if (n > 0) return absl::OkStatus();
    if (n < 0 && errno != EINTR) {
      return absl::UnavailableError(absl::StrCat("poll: ", std::strerror(errno)));
    }
  }
}

size_t AdvanceIov(absl::Span<iovec> iov, size_t first, size_t n) {
  while (n > 0 && first < iov.size()) {
    size_t step = std::min(n, iov[first].iov_len);
    iov[first].iov_base = static_cast<char*>(iov[first].iov_base) + step;
    iov[first].iov_len -= step;
    n -= step;
    if (iov[first].iov_len == 0) ++first;
  }
  while (first < iov.size() && iov[first].iov_len == 0) ++first;
  return first;
}

absl::StatusOr<int> ConnectTcp(const std::string& host, uint16_t port, absl::Time deadline,
                               int buffer_bytes) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  // A segment advertised as "localhost" is dialled on loopback even where no /etc/hosts says so.
  const std::string dial = IsLocalhostName(host) ? "127.0.0.1" : host;
  int rc = getaddrinfo(dial.c_str(), std::to_string(port).c_str(), &hints, &found);
  if (rc != 0) {
    return absl::UnavailableError(absl::StrCat("cannot resolve ", host, ": ", gai_strerror(rc)));
  }
  absl::Status last = absl::UnavailableError(absl::StrCat("no address for ", host));
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    int fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (buffer_bytes > 0) {
      setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buffer_bytes, sizeof(buffer_bytes));
      setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buffer_bytes, sizeof(buffer_bytes));
    }
    if (connect(fd, a->ai_addr, a->ai_addrlen) != 0 && errno != EINPROGRESS) {
      last = absl::UnavailableError(
          absl::StrCat("connect to ", host, ":", port, ": ", std::strerror(errno)));
      close(fd);
      continue;
    }
    absl::Status ready = WaitReady(fd, POLLOUT, deadline);
    int error = 0;
    socklen_t len = sizeof(error);
    if (ready.ok()) getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &len);
    if (ready.ok() && error == 0) {
      freeaddrinfo(found);
      return fd;
    }
    last = ready.ok() ? absl::UnavailableError(absl::StrCat("connect to ", host, ":", port, ": ",
                                                            std::strerror(error)))
                      : ready;
    close(fd);
  }
  freeaddrinfo(found);
  return last;
}

absl::Status SendAll(int fd, absl::Span<iovec> iov, absl::Time deadline) {
  size_t first = AdvanceIov(iov, 0, 0);
  while (first < iov.size()) {
    msghdr message{};
    message.msg_iov = &iov[first];
    message.msg_iovlen = std::min<size_t>(iov.size() - first, IOV_MAX);
    ssize_t n = sendmsg(fd, &message, MSG_NOSIGNAL);
    if (n > 0) {
      first = AdvanceIov(iov, first, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (absl::Status s = WaitReady(fd, POLLOUT, deadline); !s.ok()) return s;
      continue;
    }
    return absl::UnavailableError(absl::StrCat("send: ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::Status RecvAll(int fd, absl::Span<iovec> iov, absl::Time deadline) {
  return RecvAtLeast(fd, iov, SIZE_MAX, deadline).status();
}

absl::StatusOr<size_t> RecvAtLeast(int fd, absl::Span<iovec> iov, size_t least,
                                   absl::Time deadline) {
  size_t first = AdvanceIov(iov, 0, 0);
  size_t got = 0;
  while (got < least && first < iov.size()) {
    ssize_t n = readv(fd, &iov[first], static_cast<int>(std::min<size_t>(iov.size() - first, IOV_MAX)));
    if (n > 0) {
      first = AdvanceIov(iov, first, static_cast<size_t>(n));
      got += static_cast<size_t>(n);
      continue;
    }
    if (n == 0) return absl::UnavailableError("connection closed by the segment");
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (absl::Status s = WaitReady(fd, POLLIN, deadline); !s.ok()) return s;
      continue;
    }
    return absl::UnavailableError(absl::StrCat("receive: ", std::strerror(errno)));
  }
  return got;
}

}  // namespace kvpool::client
