#pragma once

// TLS for the control plane (gRPC): credentials from PEM files, for the master's server and
// for everyone's channel to it (segments, clients, kvpoolctl, kvpool-bench, the Python module).
// The files are watched: a certificate, key or CA replaced on disk is used for new
// connections within `reload_interval` (rotate by writing new files and renaming them into
// place; key and certificate together). Validate* read and check the files once, so that a
// mistake is a clear error at start rather than failed handshakes later. Thread-safe.

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace grpc {
class ServerCredentials;
class ChannelCredentials;
}  // namespace grpc

namespace kvpool {

struct ServerTlsOptions {
  std::string cert_file;  // PEM certificate chain of this server
  std::string key_file;   // PEM private key of cert_file
  // Mutual TLS: client certificates are asked for and verified against this CA; a client
  // without one may still connect (and must then present a bearer token), one with a
  // certificate this CA did not sign (or expired) fails the handshake. Empty: none asked.
  std::string client_ca_file;
  // With client_ca_file: refuse the handshake of a client without a certificate.
  bool require_client_cert = false;
  absl::Duration reload_interval = absl::Seconds(60);
};

struct ClientTlsOptions {
  // The CA that signed the master's certificate. Empty: TLS off (plaintext).
  std::string ca_file;
  // This side's certificate and key for mutual TLS; both or neither.
  std::string cert_file;
  std::string key_file;
  // The name checked against the master's certificate (default: the host of its address).
  std::string server_name;
  absl::Duration reload_interval = absl::Seconds(60);

  bool enabled() const { return !ca_file.empty(); }
};

// InvalidArgument naming the file for one that cannot be read, is not PEM, a key that does
// not match its certificate, or a certificate that is expired or not yet valid.
absl::Status ValidateServerTls(const ServerTlsOptions& options);
absl::Status ValidateClientTls(const ClientTlsOptions& options);

// TLS on the TCP data plane asked for by the environment: $KVPOOL_DATA_TLS is "1" or "true"
// (kvpoolctl, kvpool-bench and the Python module read it alike).
bool DataTlsFromEnvironment();

// Call Validate* first; these do not fail, a file that goes bad later fails handshakes.
std::shared_ptr<grpc::ServerCredentials> MakeServerCredentials(const ServerTlsOptions& options);
// Insecure credentials when !options.enabled().
std::shared_ptr<grpc::ChannelCredentials> MakeChannelCredentials(const ClientTlsOptions& options);

}  // namespace kvpool
