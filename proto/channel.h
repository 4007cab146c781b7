#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/channel.h"
#include "proto/tls.h"

namespace grpc {
class ClientContext;
}

namespace kvpool {

// A gRPC channel to kvpool-master that finds a restarted master within about a second
// instead of backing off for minutes, with message limits that fit large batches.
// Plaintext, or TLS when tls.enabled() (validate the files first: ValidateClientTls).
std::shared_ptr<grpc::Channel> MakeMasterChannel(const std::string& address,
                                                 const ClientTlsOptions& tls = {});

// Sends `token` (if not empty) as "authorization: Bearer <token>" on the call: the identity a
// master with --auth-tokens knows the caller by.
void AttachToken(grpc::ClientContext& context, const std::string& token);

// The token in file `path` (surrounding whitespace dropped): InvalidArgument if the file cannot
// be read or holds no token. Files keep tokens out of command lines (ps) and shell history.
absl::StatusOr<std::string> ReadTokenFile(const std::string& path);

}  // namespace kvpool
