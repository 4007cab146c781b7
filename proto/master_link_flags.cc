#include "proto/master_link_flags.h"

#include "absl/flags/flag.h"
#include "proto/channel.h"
#include "proto/tls_flags.h"

ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA of the master's certificate: TLS to the master on (a segment's token secret "
          "travels inside it) (tools: default $KVPOOL_TLS_CA)");
ABSL_FLAG(std::string, tls_server_name, "",
          "Name to check the master's certificate against (default: the host of --master; "
          "tools: $KVPOOL_TLS_SERVER_NAME)");
ABSL_FLAG(std::string, auth_token_file, "",
          "File holding the bearer token the master knows this caller by; a segment's identity "
          "must be its --name (tools: default $KVPOOL_AUTH_TOKEN_FILE)");

namespace kvpool {

ClientTlsOptions GetMasterLinkTlsFlags(bool environment) {
  TlsIdentityFlags identity = GetTlsIdentityFlags(environment);
  return {.ca_file = FlagOrEnvironment(absl::GetFlag(FLAGS_tls_ca), "KVPOOL_TLS_CA", environment),
          .cert_file = identity.cert_file,
          .key_file = identity.key_file,
          .server_name = FlagOrEnvironment(absl::GetFlag(FLAGS_tls_server_name),
                                           "KVPOOL_TLS_SERVER_NAME", environment),
          .reload_interval = identity.reload_interval};
}

absl::StatusOr<std::string> GetAuthTokenFlag(bool environment) {
  std::string path = FlagOrEnvironment(absl::GetFlag(FLAGS_auth_token_file),
                                       "KVPOOL_AUTH_TOKEN_FILE", environment);
  if (path.empty()) return std::string();
  return ReadTokenFile(path);
}

}  // namespace kvpool
