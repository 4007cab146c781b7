#include "server/common/advertise.h"

#include "common/net.h"

namespace kvpool {

std::string AdvertisedHost(const std::string& listen_host, const std::string& advertise_host) {
  if (!advertise_host.empty()) return advertise_host;
  if (listen_host != "0.0.0.0" && listen_host != "::") return listen_host;
  return LocalHostName();
}

}  // namespace kvpool
