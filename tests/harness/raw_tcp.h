#pragma once

// A plain TCP connection for tests that speak a protocol by hand (raw data-plane frames, HTTP).

#include <string>

#include "absl/time/time.h"

namespace kvpool::testing {

// A blocking socket connected to the IPv4 `address` ("host:port"), whose receives give up after
// `recv_timeout`; -1 if the address does not parse or the connection is refused.
int ConnectRawTcp(const std::string& address, absl::Duration recv_timeout = absl::Seconds(10));

}  // namespace kvpool::testing
