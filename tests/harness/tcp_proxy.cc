#include "tests/harness/tcp_proxy.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/net.h"

namespace kvpool::testing {

absl::StatusOr<std::unique_ptr<TcpProxy>> TcpProxy::Start(const std::string& target) {
  absl::StatusOr<HostPort> parsed = ParseHostPort(target);
  if (!parsed.ok()) return parsed.status();
  std::unique_ptr<TcpProxy> proxy(new TcpProxy());
  proxy->target_host_ = parsed->host;
  proxy->target_port_ = parsed->port;
  proxy->listen_fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  if (proxy->listen_fd_ < 0 ||
      bind(proxy->listen_fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
      listen(proxy->listen_fd_, 64) != 0 ||
      getsockname(proxy->listen_fd_, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    return absl::InternalError("proxy: cannot listen");
  }
  proxy->address_ = absl::StrCat("127.0.0.1:", ntohs(address.sin_port));
  proxy->acceptor_ = std::thread([p = proxy.get()] { p->Accept(); });
  return proxy;
}

void TcpProxy::Accept() {
  while (!stopping_.load()) {
    pollfd ready{listen_fd_, POLLIN, 0};
    if (poll(&ready, 1, 50) <= 0) continue;
    int client = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (client < 0) continue;
    if (cut_.load()) {
      close(client);
      continue;
    }
    absl::MutexLock lock(&mu_);
    relays_.emplace_back([this, client] { Relay(client); });
  }
}

void TcpProxy::Relay(int client) {
  int server = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(target_port_);
  inet_pton(AF_INET, target_host_.c_str(), &address.sin_addr);
  if (server < 0 || connect(server, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    close(client);
    if (server >= 0) close(server);
    return;
  }
  {
    absl::MutexLock lock(&mu_);
    open_fds_.push_back(client);
    open_fds_.push_back(server);
  }
  char buffer[64 << 10];
  pollfd fds[2] = {{client, POLLIN, 0}, {server, POLLIN, 0}};
  while (!cut_.load() && !stopping_.load()) {
    if (poll(fds, 2, 50) <= 0) continue;
    bool done = false;
    for (int i = 0; i < 2 && !done; ++i) {
      if (fds[i].revents == 0) continue;
      ssize_t n = read(fds[i].fd, buffer, sizeof(buffer));
      if (n <= 0) {
        done = true;
        break;
      }
      for (ssize_t sent = 0; sent < n;) {
        ssize_t w = write(fds[1 - i].fd, buffer + sent, static_cast<size_t>(n - sent));
        if (w <= 0) {
          done = true;
          break;
        }
        sent += w;
      }
    }
    if (done) break;
  }
  absl::MutexLock lock(&mu_);
  std::erase(open_fds_, client);
  std::erase(open_fds_, server);
  close(client);
  close(server);
}

void TcpProxy::Cut() {
  cut_.store(true);
  absl::MutexLock lock(&mu_);
  for (int fd : open_fds_) shutdown(fd, SHUT_RDWR);
}

TcpProxy::~TcpProxy() {
  stopping_.store(true);
  Cut();
  if (acceptor_.joinable()) acceptor_.join();
  std::vector<std::thread> relays;
  {
    absl::MutexLock lock(&mu_);
    relays.swap(relays_);
  }
  for (std::thread& relay : relays) relay.join();
  if (listen_fd_ >= 0) close(listen_fd_);
}

}  // namespace kvpool::testing
