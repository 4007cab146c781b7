#include "client/data_stream.h"

#include <openssl/err.h>
#include <poll.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/socket_io.h"

namespace kvpool::client {
namespace {

class PlainStream final : public DataStream {
 public:
  explicit PlainStream(int fd) : fd_(fd) {}
  ~PlainStream() override { close(fd_); }
  absl::Status Send(absl::Span<iovec> iov, absl::Time deadline) override {
    return SendAll(fd_, iov, deadline);
  }
  absl::StatusOr<size_t> RecvAtLeast(absl::Span<iovec> iov, size_t least,
                                     absl::Time deadline) override {
    return client::RecvAtLeast(fd_, iov, least, deadline);
  }

 private:
  const int fd_;
};

// Small pieces (frame headers, small values) are gathered into records of up to this many
// bytes, so a batch of 4 KiB writes is not one record per header; larger pieces are
// written from the caller's buffer.
constexpr size_t kRecordBytes = 16 << 10;

class TlsStream final : public DataStream {
 public:
  TlsStream(int fd, SSL* ssl, std::shared_ptr<SSL_CTX> ctx)
      : fd_(fd), ssl_(ssl), ctx_(std::move(ctx)) {
    staging_.reserve(kRecordBytes);
  }
  ~TlsStream() override {
    SSL_free(ssl_);
    close(fd_);
  }

  // Runs the handshake to its end.
  absl::Status Handshake(absl::Time deadline) {
    while (true) {
      ERR_clear_error();
      int rc = SSL_connect(ssl_);
      if (rc == 1) return absl::OkStatus();
      if (absl::Status waited = Wait(rc, deadline, "TLS handshake"); !waited.ok()) return waited;
    }
  }

  absl::Status Send(absl::Span<iovec> iov, absl::Time deadline) override {
    staging_.clear();
    for (const iovec& part : iov) {
      const auto* bytes = static_cast<const uint8_t*>(part.iov_base);
      if (part.iov_len < kRecordBytes / 4 && staging_.size() + part.iov_len <= kRecordBytes) {
        staging_.insert(staging_.end(), bytes, bytes + part.iov_len);
        continue;
      }
      if (absl::Status s = FlushStaging(deadline); !s.ok()) return s;
      if (part.iov_len < kRecordBytes / 4) {
        staging_.insert(staging_.end(), bytes, bytes + part.iov_len);
      } else if (absl::Status s = Write(bytes, part.iov_len, deadline); !s.ok()) {
        return s;
      }
    }
    absl::Status flushed = FlushStaging(deadline);
    for (iovec& part : iov) part.iov_len = 0;  // all sent, as SendAll leaves it
    return flushed;
  }

  // (Past `least`, only what OpenSSL has decrypted already.)
  absl::StatusOr<size_t> RecvAtLeast(absl::Span<iovec> iov, size_t least,
                                     absl::Time deadline) override {
    size_t got = 0;
    for (iovec& part : iov) {
      while (part.iov_len > 0) {
        if (got >= least && SSL_pending(ssl_) == 0) return got;
        ERR_clear_error();
        size_t n = 0;
        int rc = SSL_read_ex(ssl_, part.iov_base, part.iov_len, &n);
        if (rc == 1) {
          part.iov_base = static_cast<uint8_t*>(part.iov_base) + n;
          part.iov_len -= n;
          got += n;
          continue;
        }
        if (absl::Status s = Wait(rc, deadline, "receive"); !s.ok()) return s;
      }
    }
    return got;
  }

 private:
  absl::Status FlushStaging(absl::Time deadline) {
    absl::Status s = Write(staging_.data(), staging_.size(), deadline);
    staging_.clear();
    return s;
  }

  absl::Status Write(const uint8_t* data, size_t length, absl::Time deadline) {
    while (length > 0) {
      ERR_clear_error();
      size_t n = 0;
      int rc = SSL_write_ex(ssl_, data, length, &n);
      if (rc == 1) {
        data += n;
        length -= n;
        continue;
      }
      if (absl::Status s = Wait(rc, deadline, "send"); !s.ok()) return s;
    }
    return absl::OkStatus();
  }

  // After an SSL call returned `rc`: waits for the socket when OpenSSL asks to, else the
  // failure as a status.
  absl::Status Wait(int rc, absl::Time deadline, const char* what) {
    int error = SSL_get_error(ssl_, rc);
    if (error == SSL_ERROR_WANT_READ) return WaitReady(fd_, POLLIN, deadline);
    if (error == SSL_ERROR_WANT_WRITE) return WaitReady(fd_, POLLOUT, deadline);
    int saved_errno = errno;
    if (error == SSL_ERROR_ZERO_RETURN) {
      return absl::UnavailableError("connection closed by the segment");
    }
    std::string reason = TlsFailureReason(
        ssl_, error == SSL_ERROR_SYSCALL && saved_errno != 0
                  ? std::string(std::strerror(saved_errno))
                  : std::string("connection closed by the segment"));
    return absl::UnavailableError(absl::StrCat(
        what, " over TLS: ", reason,
        std::strcmp(what, "TLS handshake") == 0
            ? " (does the segment serve TLS, --data-tls, with a certificate of this CA?)"
            : ""));
  }

  const int fd_;
  SSL* const ssl_;
  const std::shared_ptr<SSL_CTX> ctx_;  // outlives ssl_
  std::vector<uint8_t> staging_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<DataStream>> ConnectDataStream(const std::string& host,
                                                              uint16_t port, absl::Time deadline,
                                                              int buffer_bytes,
                                                              TlsContextSource* tls) {
  absl::StatusOr<int> fd = ConnectTcp(host, port, deadline, buffer_bytes);
  if (!fd.ok()) return fd.status();
  if (tls == nullptr) return std::make_unique<PlainStream>(*fd);
  std::shared_ptr<SSL_CTX> ctx = tls->Current();
  SSL* ssl = SSL_new(ctx.get());
  if (ssl == nullptr) {
    close(*fd);
    return absl::InternalError("SSL_new failed");
  }
  auto stream = std::make_unique<TlsStream>(*fd, ssl, std::move(ctx));
  if (SSL_set_fd(ssl, *fd) != 1 || !ExpectPeerName(ssl, host)) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot check the certificate of segment host ", host));
  }
  if (absl::Status handshake = stream->Handshake(deadline); !handshake.ok()) return handshake;
  return stream;
}

}  // namespace kvpool::client
