#pragma once

// One TCP data connection to a segment, plaintext or TLS (proto/data_tls.h), with the
// blocking-with-deadline calls of socket_io.h: the TCP transport speaks frames over either
// without knowing which. Over TLS the segment's certificate is verified against the CA and
// its name checked against the host dialled; the errors of socket_io.h apply, and a failed
// handshake is Unavailable with OpenSSL's reason (a wrong CA, a segment that does not speak
// TLS). One thread at a time per stream.

#include <sys/uio.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "proto/data_tls.h"

namespace kvpool::client {

class DataStream {
 public:
  virtual ~DataStream() = default;
  // Sends every byte of `iov` (the array is modified as it advances).
  virtual absl::Status Send(absl::Span<iovec> iov, absl::Time deadline) = 0;
  // Fills at least the first `least` bytes of `iov` (all of it where `least` is more), and as
  // much more of it as had arrived by then (never waiting for more); how many bytes it filled.
  // The array is modified as it advances.
  virtual absl::StatusOr<size_t> RecvAtLeast(absl::Span<iovec> iov, size_t least,
                                             absl::Time deadline) = 0;
  // Fills every byte of `iov`.
  absl::Status Recv(absl::Span<iovec> iov, absl::Time deadline) {
    return RecvAtLeast(iov, SIZE_MAX, deadline).status();
  }
};

// Connects to host:port (ConnectTcp) and, with `tls`, completes the TLS handshake before
// `deadline`.
absl::StatusOr<std::unique_ptr<DataStream>> ConnectDataStream(const std::string& host,
                                                              uint16_t port, absl::Time deadline,
                                                              int buffer_bytes,
                                                              TlsContextSource* tls);

}  // namespace kvpool::client
