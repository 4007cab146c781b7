#include "server/common/listen.h"

#include <boost/asio.hpp>

#include "absl/strings/str_cat.h"
#include "common/net.h"

namespace kvpool {

absl::StatusOr<uint16_t> Listen(boost::asio::ip::tcp::acceptor& acceptor,
                                const std::string& address, absl::string_view what) {
  namespace asio = boost::asio;
  absl::StatusOr<HostPort> parsed = ParseHostPort(address);
  if (!parsed.ok()) return parsed.status();
  boost::system::error_code ec;
  asio::ip::address ip = asio::ip::make_address(parsed->host, ec);
  if (ec) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " listen address \"", address, "\" is not an IP address"));
  }
  asio::ip::tcp::endpoint endpoint(ip, parsed->port);
  acceptor.open(endpoint.protocol(), ec);
  if (!ec) acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) acceptor.bind(endpoint, ec);
  if (!ec) acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen for ", what, " on ", address, ": ", ec.message()));
  }
  return acceptor.local_endpoint().port();
}

}  // namespace kvpool
