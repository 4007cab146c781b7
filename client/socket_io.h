#pragma once

// Blocking-with-deadline I/O on non-blocking TCP sockets: connect, and moving whole iovec
// lists (scatter/gather straight to and from the caller's buffers).
// Errors: DeadlineExceeded when the deadline passes, Unavailable for connection failures
// (refused, reset, closed by the peer), both with the reason.

#include <sys/uio.h>

#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace kvpool::client {

// A connected socket with TCP_NODELAY and `buffer_bytes` socket buffers (0: default).
absl::StatusOr<int> ConnectTcp(const std::string& host, uint16_t port, absl::Time deadline,
                               int buffer_bytes);

// Waits until `fd` is ready for `events` (POLLIN, POLLOUT). DeadlineExceeded when the
// deadline passes first.
absl::Status WaitReady(int fd, short events, absl::Time deadline);

// Drops `n` transferred bytes from the front of iov[first..] (shortening the entry it stops
// in) and returns the index of the first entry with bytes left.
size_t AdvanceIov(absl::Span<iovec> iov, size_t first, size_t n);

// Sends every byte of `iov` (the array is modified as it advances).
absl::Status SendAll(int fd, absl::Span<iovec> iov, absl::Time deadline);

// Fills every byte of `iov` (the array is modified as it advances).
absl::Status RecvAll(int fd, absl::Span<iovec> iov, absl::Time deadline);

// Fills at least the first `least` bytes of `iov` (all of it where `least` is more), and as
// much more of it as had arrived by then (never waiting for more); how many bytes it filled.
// The array is modified as it advances.
absl::StatusOr<size_t> RecvAtLeast(int fd, absl::Span<iovec> iov, size_t least,
                                   absl::Time deadline);

}  // namespace kvpool::client
