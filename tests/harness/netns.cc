#include "tests/harness/netns.h"

#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "common/log.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace kvpool::testing {
namespace {

constexpr char kSubnet[] = "10.87.0.";

std::string Find(std::initializer_list<const char*> paths) {
  for (const char* path : paths) {
    if (access(path, X_OK) == 0) return path;
  }
  return "";
}

std::string IpBinary() { return Find({"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"}); }
std::string NsenterBinary() { return Find({"/usr/bin/nsenter", "/bin/nsenter"}); }
std::string UnshareBinary() { return Find({"/usr/bin/unshare", "/bin/unshare"}); }

size_t ThreadCount() {
  std::error_code error;
  size_t count = 0;
  for (auto it = std::filesystem::directory_iterator("/proc/self/task", error);
       !error && it != std::filesystem::directory_iterator(); it.increment(error)) {
    ++count;
  }
  return count;
}

// Runs a command to its end; Internal with the command if it fails.
absl::Status Run(const Host& where, const std::string& binary,
                 const std::vector<std::string>& args) {
  absl::StatusOr<std::unique_ptr<Process>> process = StartOn(where, binary, args);
  if (!process.ok()) return process.status();
  int status = (*process)->Wait();
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat("`", binary, " ", absl::StrJoin(args, " "), "` failed (wait status ", status,
                   ")"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<VirtualNetwork>> VirtualNetwork::Create(
    const std::vector<std::string>& names) {
  if (geteuid() != 0) return absl::FailedPreconditionError("network namespaces need root");
  for (const auto& [tool, path] : {std::pair<const char*, std::string>{"ip (iproute2)",
                                                                       IpBinary()},
                                   {"nsenter (util-linux)", NsenterBinary()},
                                   {"unshare (util-linux)", UnshareBinary()}}) {
    if (path.empty()) return absl::FailedPreconditionError(absl::StrCat("no ", tool));
  }
  if (size_t threads = ThreadCount(); threads != 1) {
    return absl::InternalError(absl::StrCat(
        "VirtualNetwork::Create must run while the process has one thread (it has ", threads,
        "): the other threads would stay in the old namespace"));
  }
  if (unshare(CLONE_NEWNET) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot make a network namespace: unshare: ", std::strerror(errno)));
  }
  std::unique_ptr<VirtualNetwork> network(new VirtualNetwork());
  network->own_address_ = absl::StrCat(kSubnet, 1);
  if (absl::Status made = network->Ip("", {"link", "add", "name", "kvp-br", "type", "bridge"});
      !made.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot make a bridge (no bridge driver?): ", made.message()));
  }
  for (const std::vector<std::string>& step :
       {std::vector<std::string>{"link", "set", "lo", "up"},
        {"addr", "add", network->own_address_ + "/24", "dev", "kvp-br"},
        {"link", "set", "kvp-br", "up"}}) {
    if (absl::Status done = network->Ip("", step); !done.ok()) return done;
  }
  for (size_t i = 0; i < names.size(); ++i) {
    // The holder: a shell in a new namespace that says so, then sleeps until killed.
    absl::StatusOr<std::unique_ptr<Process>> holder = Process::Start(
        UnshareBinary(), {"--net", "--", "/bin/sh", "-c", "echo holding; exec sleep 1000000"});
    if (!holder.ok()) return holder.status();
    if (absl::StatusOr<std::string> ready = (*holder)->WaitForLine("holding", absl::Seconds(10));
        !ready.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("unshare --net did not start: ", ready.status().message()));
    }
    std::string pid = absl::StrCat((*holder)->pid());
    Host host;
    host.address = absl::StrCat(kSubnet, 11 + i);
    host.launcher = {NsenterBinary(), "--net=/proc/" + pid + "/ns/net", "--"};
    network->hosts_[names[i]] = host;
    network->holders_.push_back(std::move(*holder));
    std::string port = absl::StrCat("kvp-v", i);
    if (absl::Status made = network->Ip("", {"link", "add", "name", port, "type", "veth", "peer",
                                             "name", "eth0", "netns", pid});
        !made.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot make a veth pair (no veth driver?): ", made.message()));
    }
    for (const auto& [where, step] :
         {std::pair<std::string, std::vector<std::string>>{
              "", {"link", "set", port, "master", "kvp-br", "up"}},
          {names[i], {"link", "set", "lo", "up"}},
          {names[i], {"addr", "add", host.address + "/24", "dev", "eth0"}},
          {names[i], {"link", "set", "eth0", "up"}}}) {
      if (absl::Status done = network->Ip(where, step); !done.ok()) return done;
    }
  }
  return network;
}

VirtualNetwork::~VirtualNetwork() {
  // Killing the holders ends their namespaces once the servers in them have exited too.
  holders_.clear();
}

const Host& VirtualNetwork::host(const std::string& name) const {
  auto it = hosts_.find(name);
  KVPOOL_CHECK(it != hosts_.end()) << "no simulated host " << name;
  return it->second;
}

const std::string& VirtualNetwork::AddressOf(const std::string& name) const {
  return name.empty() ? own_address_ : host(name).address;
}

absl::Status VirtualNetwork::Ip(const std::string& name,
                                const std::vector<std::string>& args) const {
  return Run(name.empty() ? Host{} : host(name), IpBinary(), args);
}

absl::Status VirtualNetwork::Cut(const std::string& a, const std::string& b) {
  for (const auto& [from, to] : {std::pair{a, b}, std::pair{b, a}}) {
    if (absl::Status cut = Ip(from, {"route", "add", "blackhole", AddressOf(to) + "/32"});
        !cut.ok()) {
      return cut;
    }
  }
  cuts_.insert(std::minmax(a, b));
  return absl::OkStatus();
}

absl::Status VirtualNetwork::Heal(const std::string& a, const std::string& b) {
  for (const auto& [from, to] : {std::pair{a, b}, std::pair{b, a}}) {
    if (absl::Status healed = Ip(from, {"route", "del", "blackhole", AddressOf(to) + "/32"});
        !healed.ok()) {
      return healed;
    }
  }
  cuts_.erase(std::minmax(a, b));
  return absl::OkStatus();
}

absl::Status VirtualNetwork::HealAll() {
  while (!cuts_.empty()) {
    const auto [a, b] = *cuts_.begin();
    if (absl::Status healed = Heal(a, b); !healed.ok()) return healed;
  }
  return absl::OkStatus();
}

}  // namespace kvpool::testing
