#pragma once

// The one definition of the flags by which a process that calls the master (kvpool-segment,
// kvpoolctl, kvpool-bench) reaches it over TLS and authenticates, for the programs that link
// kvpool_master_link_flags (with kvpool_tls_flags, proto/tls_flags.h, for its certificate):
//   --tls-ca            the CA of the master's certificate: TLS to the master on
//   --tls-server-name   the name the master's certificate is checked against
//   --auth-token-file   a file holding the bearer token the master knows this caller by

#include <string>

#include "absl/status/statusor.h"
#include "proto/tls.h"

namespace kvpool {

// TLS to the master from --tls-ca, --tls-server-name and --tls-cert/--tls-key/
// --tls-reload-interval; with `environment` an empty flag takes $KVPOOL_TLS_CA,
// $KVPOOL_TLS_SERVER_NAME (and those of GetTlsIdentityFlags).
ClientTlsOptions GetMasterLinkTlsFlags(bool environment);

// The token in --auth-token-file (with `environment`: else $KVPOOL_AUTH_TOKEN_FILE); "" when
// none is given; ReadTokenFile's errors for a file that cannot be read.
absl::StatusOr<std::string> GetAuthTokenFlag(bool environment);

}  // namespace kvpool
