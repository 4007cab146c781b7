#pragma once

// Opens, binds and listens an Asio acceptor on "ip:port" (port 0: any free port).

#include <boost/asio/ip/tcp.hpp>

#include <cstdint>
#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"

namespace kvpool {

// Returns the bound port. InvalidArgument for a malformed address or a host that is not an
// IP address; Unavailable (with the OS reason) when the port cannot be had.
// `what` names the listener in errors ("data", "HTTP").
absl::StatusOr<uint16_t> Listen(boost::asio::ip::tcp::acceptor& acceptor,
                                const std::string& address, absl::string_view what);

}  // namespace kvpool
