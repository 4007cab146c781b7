#include "common/net.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace kvpool {

absl::StatusOr<HostPort> ParseHostPort(absl::string_view address) {
  size_t colon = address.rfind(':');
  if (colon == absl::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("address \"", address, "\" has no port (expected host:port)"));
  }
  absl::string_view host = address.substr(0, colon);
  absl::string_view port_text = address.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  if (host.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("address \"", address, "\" has no host"));
  }
  uint32_t port = 0;
  if (!absl::SimpleAtoi(port_text, &port) || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("address \"", address, "\" has an invalid port \"", port_text, "\""));
  }
  return HostPort{std::string(host), static_cast<uint16_t>(port)};
}

std::string FormatHostPort(absl::string_view host, uint16_t port) {
  if (host.find(':') != absl::string_view::npos) return absl::StrCat("[", host, "]:", port);
  return absl::StrCat(host, ":", port);
}

namespace {

// The first IPv4 address of an interface that is up and not loopback; 127.0.0.1 if none.
std::string OwnInterfaceAddress() {
  std::string found = "127.0.0.1";
  ifaddrs* all = nullptr;
  if (getifaddrs(&all) != 0) return found;
  for (ifaddrs* a = all; a != nullptr; a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET) continue;
    if ((a->ifa_flags & IFF_UP) == 0 || (a->ifa_flags & IFF_LOOPBACK) != 0) continue;
    char text[INET_ADDRSTRLEN] = {};
    inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr, text, sizeof(text));
    found = text;
    break;
  }
  freeifaddrs(all);
  return found;
}

}  // namespace

bool IsLocalhostName(absl::string_view host) {
  return absl::EqualsIgnoreCase(host, "localhost") || absl::EndsWithIgnoreCase(host, ".localhost");
}

absl::StatusOr<std::string> ResolveHost(absl::string_view host) {
  std::string name(host);
  in6_addr scratch;
  if (inet_pton(AF_INET, name.c_str(), &scratch) == 1 ||
      inet_pton(AF_INET6, name.c_str(), &scratch) == 1) {
    return name;
  }
  if (IsLocalhostName(name)) return std::string("127.0.0.1");
  addrinfo hints = {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (int rc = getaddrinfo(name.c_str(), nullptr, &hints, &found); rc != 0) {
    if (!name.empty() && name == LocalHostName()) return OwnInterfaceAddress();
    return absl::NotFoundError(absl::StrCat("host name \"", name, "\" does not resolve: ",
                                            gai_strerror(rc)));
  }
  std::string v4, v6;
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    char text[INET6_ADDRSTRLEN] = {};
    if (a->ai_family == AF_INET && v4.empty()) {
      inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ai_addr)->sin_addr, text,
                sizeof(text));
      v4 = text;
    } else if (a->ai_family == AF_INET6 && v6.empty()) {
      inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(a->ai_addr)->sin6_addr, text,
                sizeof(text));
      v6 = text;
    }
  }
  freeaddrinfo(found);
  if (!v4.empty()) return v4;
  if (!v6.empty()) return v6;
  return absl::NotFoundError(absl::StrCat("host name \"", name, "\" has no IP address"));
}

std::string MachineId() {
  std::ifstream file("/proc/sys/kernel/random/boot_id");
  std::string id;
  if (std::getline(file, id) && !id.empty()) return id;
  return LocalHostName();
}

std::string LocalHostName() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

}  // namespace kvpool
