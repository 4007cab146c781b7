#pragma once

// A TCP forwarder for fault tests: listens on a free loopback port and relays every
// connection to `target`, until Cut() closes every connection and refuses new ones (a network
// partition between one process and another, the rest of the network untouched). Thread per
// connection; for tests only.

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace kvpool::testing {

class TcpProxy {
 public:
  // `target` is "host:port" (an IPv4 address).
  static absl::StatusOr<std::unique_ptr<TcpProxy>> Start(const std::string& target);
  ~TcpProxy();

  // "127.0.0.1:PORT": what to dial instead of the target.
  const std::string& address() const { return address_; }
  void Cut();

 private:
  TcpProxy() = default;
  void Accept();
  void Relay(int client);

  std::string target_host_;
  uint16_t target_port_ = 0;
  std::string address_;
  int listen_fd_ = -1;
  std::atomic<bool> cut_{false};
  std::atomic<bool> stopping_{false};
  absl::Mutex mu_;
  std::vector<int> open_fds_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> relays_ ABSL_GUARDED_BY(mu_);
  std::thread acceptor_;
};

}  // namespace kvpool::testing
