#include "client/tools/credential_flags.h"

#include <cstdlib>

#include "absl/flags/flag.h"
#include "proto/channel.h"

ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA of the master's certificate: TLS on (default: $KVPOOL_TLS_CA)");
ABSL_FLAG(std::string, tls_cert, "",
          "Client PEM certificate for mutual TLS (default: $KVPOOL_TLS_CERT)");
ABSL_FLAG(std::string, tls_key, "", "PEM key of --tls-cert (default: $KVPOOL_TLS_KEY)");
ABSL_FLAG(std::string, tls_server_name, "",
          "Name to check the master's certificate against (default: $KVPOOL_TLS_SERVER_NAME, "
          "else the host of --master)");
ABSL_FLAG(std::string, auth_token_file, "",
          "File holding the bearer token the master knows this caller by (default: "
          "$KVPOOL_AUTH_TOKEN_FILE)");

namespace kvpool {
namespace {

std::string FlagOrEnv(const absl::Flag<std::string>& flag, const char* variable) {
  std::string value = absl::GetFlag(flag);
  if (value.empty()) {
    if (const char* env = std::getenv(variable); env != nullptr) value = env;
  }
  return value;
}

}  // namespace

absl::Status ApplyCredentialFlags(ClientOptions& options) {
  options.tls_ca_file = FlagOrEnv(FLAGS_tls_ca, "KVPOOL_TLS_CA");
  options.tls_cert_file = FlagOrEnv(FLAGS_tls_cert, "KVPOOL_TLS_CERT");
  options.tls_key_file = FlagOrEnv(FLAGS_tls_key, "KVPOOL_TLS_KEY");
  options.tls_server_name = FlagOrEnv(FLAGS_tls_server_name, "KVPOOL_TLS_SERVER_NAME");
  if (std::string path = FlagOrEnv(FLAGS_auth_token_file, "KVPOOL_AUTH_TOKEN_FILE");
      !path.empty()) {
    absl::StatusOr<std::string> token = ReadTokenFile(path);
    if (!token.ok()) return token.status();
    options.auth_token = *std::move(token);
  }
  return absl::OkStatus();
}

}  // namespace kvpool
