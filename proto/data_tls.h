#pragma once

// TLS for the data plane (the segment's TCP data port and the client's TCP transport), with
// OpenSSL directly: the same options, files and checks as the control plane (proto/tls.h),
// the same rotation. A source hands out the SSL_CTX for new connections; at most once per
// `reload_interval` it looks at the files (inode, size, modification time) and, when one
// changed, builds a new context from them. A replacement that does not load (a key that does
// not match its certificate, a half-written file) is logged and the previous context stays
// in use, so rotation never takes the data plane down. Connections already open keep the
// context they began with. Thread-safe.
//
// Server: presents cert_file/key_file; with client_ca_file asks for a client certificate and
// verifies it against that CA (required with require_client_cert). Client: verifies the
// server's certificate against ca_file (the name is checked per connection, see
// ExpectPeerName) and presents cert_file/key_file when given. TLS 1.2 at least; no session
// tickets (data connections are pooled and long-lived); no renegotiation.

#include <openssl/ssl.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/tls.h"

namespace kvpool {

class TlsContextSource {
 public:
  // InvalidArgument (from Validate*Tls, naming the file) for files that do not load.
  static absl::StatusOr<std::shared_ptr<TlsContextSource>> ForServer(
      const ServerTlsOptions& options);
  static absl::StatusOr<std::shared_ptr<TlsContextSource>> ForClient(
      const ClientTlsOptions& options);

  // The context for a new connection (never null).
  std::shared_ptr<SSL_CTX> Current() ABSL_LOCKS_EXCLUDED(mu_);

  // Times a changed file was loaded into a new context.
  int reloads() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct FileStamp {
    uint64_t inode = 0;
    int64_t size = -1;
    int64_t mtime_ns = 0;
    bool operator==(const FileStamp&) const = default;
  };

  TlsContextSource(bool server, ServerTlsOptions server_options, ClientTlsOptions client_options);
  absl::StatusOr<std::shared_ptr<SSL_CTX>> Build() const;
  std::vector<FileStamp> Stamps() const;
  // The first context, and the stamps and time of its files' next check.
  absl::Status LoadFirst() ABSL_LOCKS_EXCLUDED(mu_);

  const bool server_;
  const ServerTlsOptions server_options_;
  const ClientTlsOptions client_options_;
  const absl::Duration reload_interval_;
  mutable absl::Mutex mu_;
  std::shared_ptr<SSL_CTX> current_ ABSL_GUARDED_BY(mu_);
  std::vector<FileStamp> stamps_ ABSL_GUARDED_BY(mu_);
  absl::Time next_check_ ABSL_GUARDED_BY(mu_);
  int reloads_ ABSL_GUARDED_BY(mu_) = 0;
};

// Makes `ssl` (a client connection) check the server's certificate names `host`: an IP
// address against the certificate's IP names, anything else against its DNS names (and sent
// as SNI). False if OpenSSL refused the name.
bool ExpectPeerName(SSL* ssl, const std::string& host);

// The reason of the last failed TLS operation on `ssl` for a message: the certificate check
// that failed, or OpenSSL's error queue (cleared), or `fallback`.
std::string TlsFailureReason(SSL* ssl, const std::string& fallback);

}  // namespace kvpool
