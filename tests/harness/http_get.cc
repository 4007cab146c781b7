#include "tests/harness/http_get.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/net.h"
#include "tests/harness/raw_tcp.h"

namespace kvpool::testing {

absl::StatusOr<HttpReply> HttpFetch(const std::string& address, const std::string& path,
                                    const std::string& headers) {
  if (absl::StatusOr<HostPort> target = ParseHostPort(address); !target.ok()) {
    return target.status();
  }
  int fd = ConnectRawTcp(address, absl::Seconds(5));
  if (fd < 0) return absl::UnavailableError(absl::StrCat("cannot connect to ", address));
  std::string request = absl::StrCat("GET ", path, " HTTP/1.1\r\nHost: ", address,
                                     "\r\nConnection: close\r\n", headers, "\r\n");
  send(fd, request.data(), request.size(), MSG_NOSIGNAL);
  std::string response;
  char buffer[65536];
  ssize_t n;
  while ((n = recv(fd, buffer, sizeof(buffer), 0)) > 0) response.append(buffer, n);
  close(fd);
  size_t space = response.find(' ');
  size_t body = response.find("\r\n\r\n");
  HttpReply reply;
  if (space == std::string::npos || body == std::string::npos ||
      !absl::SimpleAtoi(response.substr(space + 1, 3), &reply.status)) {
    return absl::UnavailableError(absl::StrCat("malformed HTTP answer from ", address));
  }
  reply.body = response.substr(body + 4);
  return reply;
}

absl::StatusOr<std::string> HttpGet(const std::string& address, const std::string& path) {
  absl::StatusOr<HttpReply> reply = HttpFetch(address, path);
  if (!reply.ok()) return reply.status();
  if (reply->status != 200) {
    return absl::FailedPreconditionError(
        absl::StrCat("GET ", path, " answered ", reply->status, ": ", reply->body));
  }
  return reply->body;
}

}  // namespace kvpool::testing
