#pragma once

// Simulated hosts for multi-host tests on one machine: each host a network namespace of its
// own with one IPv4 address on a bridge, so that servers bind non-loopback addresses, advertise
// them and talk TCP between "machines", and a test can cut one host off from another while
// the rest of the network stays up.
//
// The calling process first moves into a fresh namespace of its own, which holds the bridge
// and the caller's own address (the test's client runs there): nothing is added to the
// machine's own network, and runs side by side never meet. The hosts' namespaces have no
// names (no `ip netns add`): each is held by a small process of the caller's, which dies with
// the caller however it ends (PR_SET_PDEATHSIG), and the kernel removes a namespace, with its
// links and routes, when the last process in it exits. So nothing is left behind after a
// failure or a crash, and there are no stale names of earlier runs to clean up.
//
// Needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN), iproute2's `ip`, util-linux's `unshare` and
// `nsenter`, and the kernel's veth and bridge drivers. Not thread-safe; one per process.

#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "tests/harness/process.h"

namespace kvpool::testing {

class VirtualNetwork {
 public:
  // Moves the calling process into a network namespace of its own, which it must do while it
  // has one thread (from main or a gtest Environment's SetUp: threads made later follow it),
  // and creates one host per name, at 10.87.0.11, .12, ..., on a bridge whose address,
  // 10.87.0.1, is the caller's. FailedPrecondition, saying what is missing, where namespaces
  // cannot be made on this machine (the caller skips); Internal if a later step fails.
  static absl::StatusOr<std::unique_ptr<VirtualNetwork>> Create(
      const std::vector<std::string>& names);
  ~VirtualNetwork();

  // The host called `name`; its launcher runs a binary in the host's namespace.
  const Host& host(const std::string& name) const;
  // The calling process's own address on the bridge.
  const std::string& own_address() const { return own_address_; }

  // Drops every packet between hosts `a` and `b`, both ways (a blackhole route to the other's
  // address in each: established connections stall, new ones fail at once); "" is the
  // calling process. Heal undoes it; HealAll undoes every cut still in place (the hosts
  // outlive a test: its fixture calls this when the test ends, however it ended).
  absl::Status Cut(const std::string& a, const std::string& b);
  absl::Status Heal(const std::string& a, const std::string& b);
  absl::Status HealAll();

  // Runs `ip args...` in the namespace of host `name` ("": the calling process's).
  absl::Status Ip(const std::string& name, const std::vector<std::string>& args) const;

 private:
  VirtualNetwork() = default;
  const std::string& AddressOf(const std::string& name) const;

  std::string own_address_;
  std::map<std::string, Host> hosts_;
  std::set<std::pair<std::string, std::string>> cuts_;  // each pair in name order
  // The processes holding the hosts' namespaces.
  std::vector<std::unique_ptr<Process>> holders_;
};

}  // namespace kvpool::testing
