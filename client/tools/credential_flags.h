#pragma once

// The command-line flags by which kvpoolctl and kvpool-bench carry credentials to the master:
// --tls-ca, --tls-cert, --tls-key, --tls-server-name, --data-tls and --auth-token-file. A flag
// left empty takes the environment variable of the same name (KVPOOL_TLS_CA, KVPOOL_TLS_CERT,
// KVPOOL_TLS_KEY, KVPOOL_TLS_SERVER_NAME, KVPOOL_DATA_TLS=1, KVPOOL_AUTH_TOKEN_FILE), as the
// Python module does.

#include "absl/status/status.h"
#include "kvpool/client.h"

namespace kvpool {

// Fills the TLS and token fields of `options`. InvalidArgument if the token file cannot be
// read.
absl::Status ApplyCredentialFlags(ClientOptions& options);

}  // namespace kvpool
