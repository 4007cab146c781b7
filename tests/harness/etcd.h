#pragma once

// A real etcd (Debian's etcd-server, /usr/bin/etcd) for tests: a single member on free ports
// of loopback (or on 2379 and 2380 of a simulated host, tests/harness/netns.h), its data in a
// fresh temporary directory (removed with it), waited for by asking it, never by sleeping.
// Kill() and Start() again restart it on the same ports and data.

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "tests/harness/process.h"

namespace kvpool::testing {

class EtcdServer {
 public:
  // NotFound (the caller skips) when etcd is not installed; Unavailable if it does not
  // answer within a minute.
  static absl::StatusOr<std::unique_ptr<EtcdServer>> Start(const Host& host = {});
  ~EtcdServer();

  // "host:port" of its client URL.
  const std::string& endpoint() const { return endpoint_; }
  void Kill();
  // Starts it again (after Kill) on the same ports and data; waits until it answers.
  absl::Status Restart();
  Process* process() { return process_.get(); }

 private:
  EtcdServer() = default;
  absl::Status Launch();

  Host host_;
  uint16_t client_port_ = 0;
  uint16_t peer_port_ = 0;
  std::string data_dir_;
  std::string endpoint_;
  std::unique_ptr<Process> process_;
};

// Where etcd is installed ("" if it is not).
std::string EtcdBinary();

// A TCP port of `host` that was free a moment ago, below the ephemeral range (etcd cannot
// listen on port 0, and masters of an HA pool need their addresses known up front).
absl::StatusOr<uint16_t> PickFreePort(const std::string& host);

}  // namespace kvpool::testing
