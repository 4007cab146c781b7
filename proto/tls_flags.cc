#include "proto/tls_flags.h"

#include <cstdlib>

#include "absl/flags/flag.h"

ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate (chain) of this process: the master's server certificate (TLS on); "
          "a segment's or client's certificate for mutual TLS to the master, and a segment's "
          "data-plane certificate with --data-tls (tools: default $KVPOOL_TLS_CERT)");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls-cert (tools: $KVPOOL_TLS_KEY)");
ABSL_FLAG(absl::Duration, tls_reload_interval, absl::Seconds(60),
          "How often the TLS files are checked for replacement (certificate rotation)");

namespace kvpool {

std::string FlagOrEnvironment(const std::string& flag, const char* variable, bool environment) {
  if (!flag.empty() || !environment) return flag;
  const char* value = std::getenv(variable);
  return value == nullptr ? "" : value;
}

TlsIdentityFlags GetTlsIdentityFlags(bool environment) {
  return {.cert_file = FlagOrEnvironment(absl::GetFlag(FLAGS_tls_cert), "KVPOOL_TLS_CERT",
                                         environment),
          .key_file =
              FlagOrEnvironment(absl::GetFlag(FLAGS_tls_key), "KVPOOL_TLS_KEY", environment),
          .reload_interval = absl::GetFlag(FLAGS_tls_reload_interval)};
}

}  // namespace kvpool
