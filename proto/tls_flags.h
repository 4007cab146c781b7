#pragma once

// The one definition of the TLS identity flags every kvpool binary takes, for the programs
// that link kvpool_tls_flags (kvpool-master, kvpool-segment, kvpoolctl, kvpool-bench):
//   --tls-cert, --tls-key    this process's PEM certificate (chain) and key: the master's
//                            server certificate; a segment's or a client's certificate for
//                            mutual TLS to the master (and a segment's data-plane server
//                            certificate with --data-tls)
//   --tls-reload-interval    how often those files (and the CA) are looked at for rotation
// What calls the master also links kvpool_master_link_flags (proto/master_link_flags.h).
// Flags are process-wide by nature (absl); nothing else is kept here.

#include <string>

#include "absl/time/time.h"

namespace kvpool {

struct TlsIdentityFlags {
  std::string cert_file;
  std::string key_file;
  absl::Duration reload_interval;
};

// The flags' values; with `environment`, an empty --tls-cert/--tls-key takes $KVPOOL_TLS_CERT
// and $KVPOOL_TLS_KEY (the tools, as the Python module does).
TlsIdentityFlags GetTlsIdentityFlags(bool environment);

// `flag`'s value, or, when empty and `environment`, that of the environment variable.
std::string FlagOrEnvironment(const std::string& flag, const char* variable, bool environment);

}  // namespace kvpool
