#pragma once

// Network addresses as "host:port" strings ("127.0.0.1:50051", "[::1]:50051", "node-3:0").

#include <cstdint>
#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"

namespace kvpool {

struct HostPort {
  std::string host;
  uint16_t port = 0;
};

// InvalidArgument when there is no ":port", the port is not a number in 0..65535, or the
// host is empty.
absl::StatusOr<HostPort> ParseHostPort(absl::string_view address);

// Inverse of ParseHostPort; brackets IPv6 literals.
std::string FormatHostPort(absl::string_view host, uint16_t port);

// "localhost" or a name under ".localhost", in any case: loopback by definition (RFC 6761),
// whatever /etc/hosts says (a minimal root has none).
bool IsLocalhostName(absl::string_view host);

// An IP address literal for `host`: itself if it is one already ("10.0.0.5", "::1"); 127.0.0.1
// for "localhost" and names under ".localhost" without asking the resolver (RFC 6761: a
// minimal root may have no /etc/hosts); else the first IPv4 (then IPv6) address the resolver
// gives for the name. This machine's own host name, where the resolver does not know it, is the
// first IPv4 address of an interface that is up and not loopback, else 127.0.0.1 (as glibc's
// nss-myhostname answers). NotFound if any other name does not resolve.
absl::StatusOr<std::string> ResolveHost(absl::string_view host);

// This machine's host name ("localhost" if it cannot be read).
std::string LocalHostName();

// Identifies the running kernel: equal for every process (and container) of one machine
// since its boot, so two processes with the same id can share memory. The kernel's boot_id,
// or the host name if it cannot be read.
std::string MachineId();

}  // namespace kvpool
