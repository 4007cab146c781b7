#include "proto/data_tls.h"

#include <arpa/inet.h>
#include <openssl/err.h>
#include <openssl/x509v3.h>
#include <sys/stat.h>

#include "absl/strings/str_cat.h"
#include "common/log.h"

namespace kvpool {
namespace {

struct CtxFree {
  void operator()(SSL_CTX* ctx) const { SSL_CTX_free(ctx); }
};

std::string OpenSslErrors() {
  std::string text;
  while (unsigned long e = ERR_get_error()) {
    char buffer[256];
    ERR_error_string_n(e, buffer, sizeof(buffer));
    if (!text.empty()) text += "; ";
    text += buffer;
  }
  return text;
}

absl::Status LoadFailure(const std::string& what, const std::string& file) {
  return absl::InvalidArgumentError(
      absl::StrCat("cannot load ", what, " ", file, ": ", OpenSslErrors()));
}

absl::Status UseKeyPair(SSL_CTX* ctx, const std::string& cert_file, const std::string& key_file) {
  if (SSL_CTX_use_certificate_chain_file(ctx, cert_file.c_str()) != 1) {
    return LoadFailure("TLS certificate", cert_file);
  }
  if (SSL_CTX_use_PrivateKey_file(ctx, key_file.c_str(), SSL_FILETYPE_PEM) != 1) {
    return LoadFailure("TLS key", key_file);
  }
  if (SSL_CTX_check_private_key(ctx) != 1) {
    return LoadFailure(absl::StrCat("TLS key ", key_file, " against certificate"), cert_file);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::shared_ptr<TlsContextSource>> TlsContextSource::ForServer(
    const ServerTlsOptions& options) {
  if (absl::Status valid = ValidateServerTls(options); !valid.ok()) return valid;
  std::shared_ptr<TlsContextSource> source(new TlsContextSource(true, options, {}));
  if (absl::Status loaded = source->LoadFirst(); !loaded.ok()) return loaded;
  return source;
}

absl::StatusOr<std::shared_ptr<TlsContextSource>> TlsContextSource::ForClient(
    const ClientTlsOptions& options) {
  if (!options.enabled()) {
    return absl::InvalidArgumentError("TLS on the data plane needs the CA (--tls-ca)");
  }
  if (absl::Status valid = ValidateClientTls(options); !valid.ok()) return valid;
  std::shared_ptr<TlsContextSource> source(new TlsContextSource(false, {}, options));
  if (absl::Status loaded = source->LoadFirst(); !loaded.ok()) return loaded;
  return source;
}

TlsContextSource::TlsContextSource(bool server, ServerTlsOptions server_options,
                                   ClientTlsOptions client_options)
    : server_(server),
      server_options_(std::move(server_options)),
      client_options_(std::move(client_options)),
      reload_interval_(server ? server_options_.reload_interval : client_options_.reload_interval) {}

absl::Status TlsContextSource::LoadFirst() {
  absl::StatusOr<std::shared_ptr<SSL_CTX>> ctx = Build();
  if (!ctx.ok()) return ctx.status();
  absl::MutexLock lock(&mu_);
  current_ = *std::move(ctx);
  stamps_ = Stamps();
  next_check_ = absl::Now() + reload_interval_;
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<SSL_CTX>> TlsContextSource::Build() const {
  ERR_clear_error();
  std::unique_ptr<SSL_CTX, CtxFree> ctx(
      SSL_CTX_new(server_ ? TLS_server_method() : TLS_client_method()));
  if (ctx == nullptr) return absl::InternalError(absl::StrCat("SSL_CTX_new: ", OpenSslErrors()));
  SSL_CTX_set_min_proto_version(ctx.get(), TLS1_2_VERSION);
  SSL_CTX_set_options(ctx.get(), SSL_OP_NO_RENEGOTIATION | SSL_OP_NO_TICKET);
  SSL_CTX_set_mode(ctx.get(), SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  if (server_) {
    const ServerTlsOptions& o = server_options_;
    SSL_CTX_set_num_tickets(ctx.get(), 0);
    if (absl::Status pair = UseKeyPair(ctx.get(), o.cert_file, o.key_file); !pair.ok()) {
      return pair;
    }
    if (!o.client_ca_file.empty()) {
      if (SSL_CTX_load_verify_locations(ctx.get(), o.client_ca_file.c_str(), nullptr) != 1) {
        return LoadFailure("client CA", o.client_ca_file);
      }
      STACK_OF(X509_NAME)* names = SSL_load_client_CA_file(o.client_ca_file.c_str());
      if (names != nullptr) SSL_CTX_set_client_CA_list(ctx.get(), names);
      SSL_CTX_set_verify(ctx.get(),
                         SSL_VERIFY_PEER |
                             (o.require_client_cert ? SSL_VERIFY_FAIL_IF_NO_PEER_CERT : 0),
                         nullptr);
    }
  } else {
    const ClientTlsOptions& o = client_options_;
    if (SSL_CTX_load_verify_locations(ctx.get(), o.ca_file.c_str(), nullptr) != 1) {
      return LoadFailure("TLS CA", o.ca_file);
    }
    SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_PEER, nullptr);
    if (!o.cert_file.empty()) {
      if (absl::Status pair = UseKeyPair(ctx.get(), o.cert_file, o.key_file); !pair.ok()) {
        return pair;
      }
    }
  }
  return std::shared_ptr<SSL_CTX>(ctx.release(), CtxFree());
}

std::vector<TlsContextSource::FileStamp> TlsContextSource::Stamps() const {
  std::vector<std::string> files =
      server_ ? std::vector<std::string>{server_options_.cert_file, server_options_.key_file,
                                         server_options_.client_ca_file}
              : std::vector<std::string>{client_options_.ca_file, client_options_.cert_file,
                                         client_options_.key_file};
  std::vector<FileStamp> stamps;
  for (const std::string& file : files) {
    FileStamp stamp;
    struct stat st {};
    if (!file.empty() && stat(file.c_str(), &st) == 0) {
      stamp = {static_cast<uint64_t>(st.st_ino), static_cast<int64_t>(st.st_size),
               static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec};
    }
    stamps.push_back(stamp);
  }
  return stamps;
}

std::shared_ptr<SSL_CTX> TlsContextSource::Current() {
  absl::MutexLock lock(&mu_);
  absl::Time now = absl::Now();
  if (now < next_check_) return current_;
  next_check_ = now + reload_interval_;
  std::vector<FileStamp> stamps = Stamps();
  if (stamps == stamps_) return current_;
  absl::StatusOr<std::shared_ptr<SSL_CTX>> rebuilt = Build();
  if (!rebuilt.ok()) {
    // Keep the old context; try again at the next check (stamps_ stays as it was).
    KVPOOL_LOG(WARNING) << "data-plane TLS files changed but do not load, keeping the previous "
                           "ones: "
                        << rebuilt.status().message();
    return current_;
  }
  KVPOOL_LOG(INFO) << "data-plane TLS: reloaded the changed certificate files";
  current_ = *std::move(rebuilt);
  stamps_ = std::move(stamps);
  ++reloads_;
  return current_;
}

int TlsContextSource::reloads() const {
  absl::MutexLock lock(&mu_);
  return reloads_;
}

bool ExpectPeerName(SSL* ssl, const std::string& host) {
  in6_addr ip6{};
  in_addr ip4{};
  X509_VERIFY_PARAM* param = SSL_get0_param(ssl);
  if (inet_pton(AF_INET, host.c_str(), &ip4) == 1 ||
      inet_pton(AF_INET6, host.c_str(), &ip6) == 1) {
    return X509_VERIFY_PARAM_set1_ip_asc(param, host.c_str()) == 1;
  }
  X509_VERIFY_PARAM_set_hostflags(param, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
  return SSL_set_tlsext_host_name(ssl, host.c_str()) == 1 && SSL_set1_host(ssl, host.c_str()) == 1;
}

std::string TlsFailureReason(SSL* ssl, const std::string& fallback) {
  if (ssl != nullptr) {
    long verify = SSL_get_verify_result(ssl);
    if (verify != X509_V_OK) {
      ERR_clear_error();
      return absl::StrCat("certificate check failed: ", X509_verify_cert_error_string(verify));
    }
  }
  std::string errors = OpenSslErrors();
  return errors.empty() ? fallback : errors;
}

}  // namespace kvpool
