#include "tests/harness/raw_tcp.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/net.h"

namespace kvpool::testing {

int ConnectRawTcp(const std::string& address, absl::Duration recv_timeout) {
  absl::StatusOr<HostPort> target = ParseHostPort(address);
  if (!target.ok()) return -1;
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  timeval timeout = absl::ToTimeval(recv_timeout);
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(target->port);
  inet_pton(AF_INET, target->host.c_str(), &sa.sin_addr);
  if (connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

}  // namespace kvpool::testing
