#include "client/tools/credential_flags.h"

#include "absl/flags/flag.h"
#include "proto/master_link_flags.h"
#include "proto/tls.h"

// --tls-ca, --tls-cert, --tls-key, --tls-server-name, --tls-reload-interval, --auth-token-file:
// proto/tls_flags.h and proto/master_link_flags.h.
ABSL_FLAG(bool, data_tls, false,
          "TLS on the TCP data connections to segments too (segments started with --data-tls): "
          "their certificates are verified against --tls-ca (default: $KVPOOL_DATA_TLS=1)");

namespace kvpool {

absl::Status ApplyCredentialFlags(ClientOptions& options) {
  ClientTlsOptions tls = GetMasterLinkTlsFlags(/*environment=*/true);
  options.tls_ca_file = tls.ca_file;
  options.tls_cert_file = tls.cert_file;
  options.tls_key_file = tls.key_file;
  options.tls_server_name = tls.server_name;
  options.data_tls = absl::GetFlag(FLAGS_data_tls) || DataTlsFromEnvironment();
  absl::StatusOr<std::string> token = GetAuthTokenFlag(/*environment=*/true);
  if (!token.ok()) return token.status();
  if (!token->empty()) options.auth_token = *std::move(token);
  return absl::OkStatus();
}

}  // namespace kvpool
