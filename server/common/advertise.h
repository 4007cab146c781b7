#pragma once

#include <string>

namespace kvpool {

// The host name clients should dial for a server listening on `listen_host`: the explicit
// `advertise_host` if given, else the listen host unless it is a wildcard (0.0.0.0, ::), else
// this machine's host name.
std::string AdvertisedHost(const std::string& listen_host, const std::string& advertise_host);

}  // namespace kvpool
