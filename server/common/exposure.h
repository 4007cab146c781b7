#pragma once

// Safe defaults for the servers' listening addresses. A server whose every address is
// loopback may run without TLS and authentication (the single-node quick start); one that
// binds any other address must have both, or be started with --insecure, which is logged as
// a warning. Pure; thread-safe.

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace kvpool {

struct Exposure {
  // (flag, address) of every listening socket, e.g. {"--listen", "0.0.0.0:50051"}.
  std::vector<std::pair<std::string, std::string>> listens;
  // What protects the control plane: TLS on it, and callers authenticated.
  bool tls = false;
  bool authenticated = false;
  bool insecure = false;  // --insecure
};

struct ExposureVerdict {
  // Lines to log: at INFO when `warning` is false, else at WARNING.
  std::string message;
  bool warning = false;
};

// True for 127.0.0.0/8, ::1 and localhost.
bool IsLoopbackHost(const std::string& host);

// FailedPrecondition naming the flag and address when a non-loopback address is bound
// without TLS and authentication and without --insecure; InvalidArgument for an address
// that does not parse. Else what to log.
absl::StatusOr<ExposureVerdict> CheckExposure(const Exposure& exposure);

}  // namespace kvpool
