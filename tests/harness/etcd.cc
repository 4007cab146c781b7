#include "tests/harness/etcd.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "common/etcd/etcd_client.h"

namespace kvpool::testing {

std::string EtcdBinary() {
  for (const char* path : {"/usr/bin/etcd", "/usr/local/bin/etcd"}) {
    if (access(path, X_OK) == 0) return path;
  }
  return "";
}

absl::StatusOr<uint16_t> PickFreePort(const std::string& host) {
  // Below the kernel's ephemeral range (32768 and up by default): a port taken from there
  // can be handed out again as the source port of an outgoing connection, and a client
  // dialling it before the server listens then connects to itself (TCP simultaneous open).
  static std::atomic<uint32_t> next{20000 + static_cast<uint32_t>(getpid() * 37 % 10000)};
  for (int attempt = 0; attempt < 200; ++attempt) {
    uint16_t port = static_cast<uint16_t>(20000 + next.fetch_add(1) % 12000);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return absl::InternalError("socket failed");
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(port);
    if (inet_pton(AF_INET, host.c_str(), &address.sin_addr) != 1) {
      close(fd);
      return absl::InvalidArgumentError(absl::StrCat(host, " is not an IPv4 address"));
    }
    bool free = bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0;
    close(fd);
    if (free) return port;
  }
  return absl::UnavailableError(absl::StrCat("no free port on ", host));
}

absl::StatusOr<std::unique_ptr<EtcdServer>> EtcdServer::Start(const Host& host) {
  if (EtcdBinary().empty()) {
    return absl::NotFoundError("etcd is not installed (Debian: apt-get install etcd-server)");
  }
  std::unique_ptr<EtcdServer> server(new EtcdServer());
  server->host_ = host;
  char pattern[] = "/tmp/kvpool-etcd-XXXXXX";
  if (mkdtemp(pattern) == nullptr) return absl::InternalError("mkdtemp failed");
  server->data_dir_ = pattern;
  // Two ports that are free now; another process may take one before etcd binds it, so try
  // a few pairs.
  absl::Status launched = absl::UnavailableError("no attempt");
  if (!host.launcher.empty()) {
    // A host of its own: etcd's usual ports are free (and cannot be probed from here).
    server->client_port_ = 2379;
    server->peer_port_ = 2380;
    launched = server->Launch();
  }
  for (int attempt = 0; host.launcher.empty() && attempt < 5 && !launched.ok(); ++attempt) {
    absl::StatusOr<uint16_t> client = PickFreePort(host.address);
    absl::StatusOr<uint16_t> peer = PickFreePort(host.address);
    if (!client.ok()) return client.status();
    if (!peer.ok()) return peer.status();
    if (*client == *peer) continue;
    server->client_port_ = *client;
    server->peer_port_ = *peer;
    launched = server->Launch();
  }
  if (!launched.ok()) return launched;
  return server;
}

absl::Status EtcdServer::Launch() {
  endpoint_ = absl::StrCat(host_.address, ":", client_port_);
  std::string client_url = absl::StrCat("http://", endpoint_);
  std::string peer_url = absl::StrCat("http://", host_.address, ":", peer_port_);
  absl::StatusOr<std::unique_ptr<Process>> process = StartOn(
      host_, EtcdBinary(),
      {"--name=kvpool-test", "--data-dir=" + data_dir_, "--listen-client-urls=" + client_url,
       "--advertise-client-urls=" + client_url, "--listen-peer-urls=" + peer_url,
       "--initial-advertise-peer-urls=" + peer_url,
       "--initial-cluster=kvpool-test=" + peer_url, "--logger=zap", "--log-outputs=stderr",
       "--log-level=error"});
  if (!process.ok()) return process.status();
  process_ = std::move(*process);
  absl::StatusOr<std::unique_ptr<etcd::EtcdClient>> client =
      etcd::EtcdClient::Create(endpoint_, absl::Seconds(1));
  if (!client.ok()) return client.status();
  absl::Time deadline = absl::Now() + absl::Minutes(1);
  absl::Status answered = absl::UnavailableError("not asked yet");
  while (absl::Now() < deadline) {
    answered = (*client)->Get("/kvpool-test-readiness").status();
    if (answered.ok()) return absl::OkStatus();
    // Exited (a port taken under it): give up on these ports.
    if (absl::IsUnavailable(process_->WaitForLine("\x01never", absl::Milliseconds(100)).status())) {
      break;
    }
  }
  process_.reset();
  return absl::UnavailableError(
      absl::StrCat("etcd on ", endpoint_, " did not answer: ", answered.message()));
}

void EtcdServer::Kill() { process_.reset(); }

absl::Status EtcdServer::Restart() {
  process_.reset();
  return Launch();
}

EtcdServer::~EtcdServer() {
  process_.reset();
  std::error_code ignored;
  std::filesystem::remove_all(data_dir_, ignored);
}

}  // namespace kvpool::testing
