#include "proto/tls.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/security/tls_certificate_provider.h"
#include "grpcpp/security/tls_credentials_options.h"

namespace kvpool {
namespace {

absl::StatusOr<std::string> ReadFile(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(absl::StrCat("cannot read ", what, " ", path));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

struct BioFree {
  void operator()(BIO* bio) const { BIO_free(bio); }
};
struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
struct KeyFree {
  void operator()(EVP_PKEY* key) const { EVP_PKEY_free(key); }
};

std::unique_ptr<BIO, BioFree> MemoryBio(const std::string& pem) {
  return std::unique_ptr<BIO, BioFree>(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}

// The first certificate of a PEM file, checked for its validity period.
absl::StatusOr<std::unique_ptr<X509, X509Free>> ReadCertificate(const std::string& path,
                                                                 const char* what) {
  absl::StatusOr<std::string> pem = ReadFile(path, what);
  if (!pem.ok()) return pem.status();
  auto bio = MemoryBio(*pem);
  std::unique_ptr<X509, X509Free> cert(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
  ERR_clear_error();
  if (cert == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " ", path, " holds no PEM certificate"));
  }
  if (X509_cmp_current_time(X509_get0_notAfter(cert.get())) < 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, " ", path, " has expired"));
  }
  if (X509_cmp_current_time(X509_get0_notBefore(cert.get())) > 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, " ", path, " is not valid yet"));
  }
  return cert;
}

absl::Status CheckKeyPair(const std::string& cert_file, const std::string& key_file,
                          const char* side) {
  if (cert_file.empty() != key_file.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(side, ": a TLS certificate needs its key and a key its certificate"));
  }
  if (cert_file.empty()) return absl::OkStatus();
  absl::StatusOr<std::unique_ptr<X509, X509Free>> cert =
      ReadCertificate(cert_file, "TLS certificate");
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> pem = ReadFile(key_file, "TLS key");
  if (!pem.ok()) return pem.status();
  auto bio = MemoryBio(*pem);
  std::unique_ptr<EVP_PKEY, KeyFree> key(
      PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr));
  ERR_clear_error();
  if (key == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("TLS key ", key_file, " holds no PEM private key (or is encrypted)"));
  }
  if (X509_check_private_key(cert->get(), key.get()) != 1) {
    ERR_clear_error();
    return absl::InvalidArgumentError(
        absl::StrCat("TLS key ", key_file, " does not match certificate ", cert_file));
  }
  return absl::OkStatus();
}

unsigned int Seconds(absl::Duration interval) {
  return static_cast<unsigned int>(std::max<int64_t>(1, absl::ToInt64Seconds(interval)));
}

}  // namespace

absl::Status ValidateServerTls(const ServerTlsOptions& options) {
  if (options.cert_file.empty()) {
    return absl::InvalidArgumentError("TLS on the server needs --tls-cert and --tls-key");
  }
  if (absl::Status pair = CheckKeyPair(options.cert_file, options.key_file, "server");
      !pair.ok()) {
    return pair;
  }
  if (!options.client_ca_file.empty()) {
    absl::StatusOr<std::unique_ptr<X509, X509Free>> ca =
        ReadCertificate(options.client_ca_file, "client CA");
    if (!ca.ok()) return ca.status();
  } else if (options.require_client_cert) {
    return absl::InvalidArgumentError("requiring client certificates needs a client CA");
  }
  return absl::OkStatus();
}

absl::Status ValidateClientTls(const ClientTlsOptions& options) {
  if (!options.enabled()) {
    if (!options.cert_file.empty() || !options.key_file.empty()) {
      return absl::InvalidArgumentError(
          "a client certificate is only sent over TLS: give the master's CA too (--tls-ca)");
    }
    return absl::OkStatus();
  }
  absl::StatusOr<std::unique_ptr<X509, X509Free>> ca = ReadCertificate(options.ca_file, "TLS CA");
  if (!ca.ok()) return ca.status();
  return CheckKeyPair(options.cert_file, options.key_file, "client");
}

std::shared_ptr<grpc::ServerCredentials> MakeServerCredentials(const ServerTlsOptions& options) {
  auto provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      options.key_file, options.cert_file, options.client_ca_file,
      Seconds(options.reload_interval));
  grpc::experimental::TlsServerCredentialsOptions tls(provider);
  tls.watch_identity_key_cert_pairs();
  if (options.client_ca_file.empty()) {
    tls.set_cert_request_type(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  } else {
    tls.watch_root_certs();
    tls.set_cert_request_type(options.require_client_cert
                                  ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                                  : GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY);
  }
  return grpc::experimental::TlsServerCredentials(tls);
}

std::shared_ptr<grpc::ChannelCredentials> MakeChannelCredentials(
    const ClientTlsOptions& options) {
  if (!options.enabled()) return grpc::InsecureChannelCredentials();
  auto provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      options.key_file, options.cert_file, options.ca_file, Seconds(options.reload_interval));
  grpc::experimental::TlsChannelCredentialsOptions tls;
  tls.set_certificate_provider(provider);
  tls.watch_root_certs();
  if (!options.cert_file.empty()) tls.watch_identity_key_cert_pairs();
  return grpc::experimental::TlsCredentials(tls);
}

bool DataTlsFromEnvironment() {
  const char* value = std::getenv("KVPOOL_DATA_TLS");
  return value != nullptr && (std::string_view(value) == "1" || std::string_view(value) == "true");
}

}  // namespace kvpool
