// kvpool-segment: contributes this node's memory to the pool. Allocates the pool, serves
// reads and writes of it over TCP, and keeps it mounted on the master.

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>

#include <openssl/crypto.h>
#include <openssl/sha.h>

#include "absl/flags/flag.h"
#include "common/flags.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/log.h"
#include "common/metric_families.h"
#include "common/net.h"
#include "common/size.h"
#include "proto/channel.h"
#include "proto/master_link_flags.h"
#include "proto/tls.h"
#include "server/common/exposure.h"
#include "server/common/http_server.h"
#include "server/common/signals.h"
#include "server/segment/segment.h"
#include "server/segment/segment_metrics.h"

ABSL_FLAG(std::string, master, "127.0.0.1:50051", "gRPC address of kvpool-master");
ABSL_FLAG(kvpool::ByteSize, size, kvpool::ByteSize{1ull << 30},
          "Size of the memory pool this segment contributes (4GiB, 512MB, bytes)");
ABSL_FLAG(std::string, listen, "127.0.0.1:50061", "Data-plane TCP address (port 0: any free)");
ABSL_FLAG(std::string, http_listen, "127.0.0.1:9004", "HTTP address for /healthz (port 0: any)");
ABSL_FLAG(std::string, name, "", "Segment name, unique in the cluster (default: host:port)");
ABSL_FLAG(std::string, advertise_host, "",
          "Host name clients dial for the data plane (default: the listen host, or this "
          "machine's name when listening on a wildcard address)");
ABSL_FLAG(int, threads, 2, "Data-plane threads");
ABSL_FLAG(bool, prefault, true, "Touch every page of the pool at start");
ABSL_FLAG(bool, hugepages, false,
          "Back the pool with 2 MiB huge pages reserved by the kernel (vm.nr_hugepages); "
          "--size must be a multiple of 2MiB");
ABSL_FLAG(std::string, shm_socket, "auto",
          "Unix socket through which clients on this host map the pool and copy with memcpy: a "
          "path, auto (/tmp/kvpool-segment-PORT.sock), or none");
ABSL_FLAG(std::string, shm_uids, "",
          "Who may map the pool: empty (this segment's uid and root), any, or exactly the uids "
          "listed, like 1000,1001");
ABSL_FLAG(std::string, shm_group, "",
          "A group (name or gid) whose members may reach the shared-memory socket and map the "
          "pool, besides --shm-uids; empty: none (the socket is the owner's only)");
ABSL_FLAG(int, max_connections, 4096,
          "Data-plane connections served at once; more are refused at accept (counted in "
          "kvpool_data_rejected_total{reason=\"connection_cap\"})");
ABSL_FLAG(absl::Duration, idle_timeout, absl::Minutes(5),
          "A data-plane connection with no request for this long is closed");
ABSL_FLAG(absl::Duration, request_timeout, absl::Seconds(30),
          "A data-plane request header or WRITE payload that has begun must be complete within "
          "this long, else the connection is closed");
ABSL_FLAG(std::string, rdma_device, "",
          "RDMA device to serve one-sided READ/WRITE from: a name, empty for the first one, or "
          "none. Without a device the segment serves TCP and shared memory only");
ABSL_FLAG(bool, enable_test_hooks, false,
          "Serve /debug/corrupt?offset=N on the HTTP port (flips a pool byte; tests only)");
ABSL_FLAG(bool, verify_commits, true,
          "Hash each committed range and refuse a commit whose bytes do not match its "
          "checksum (turn off only to measure what the check costs)");
ABSL_FLAG(bool, hash_shm_commits, false,
          "With --verify-commits, hash a range written through shared memory at commit too; "
          "by default its writer's done write intent is the check (no CPU pass over the "
          "bytes here; readers still verify checksums)");
ABSL_FLAG(bool, require_token, true,
          "Serve only ranges granted by the master's capability tokens (turn off only in "
          "benchmarks of the raw data plane)");
// --tls-ca, --tls-cert, --tls-key, --tls-server-name, --tls-reload-interval, --auth-token-file:
// proto/tls_flags.h and proto/master_link_flags.h.
ABSL_FLAG(bool, data_tls, false,
          "Serve the TCP data port over TLS, with --tls-cert/--tls-key as this segment's "
          "certificate (clients verify it against their --tls-ca; shared memory and RDMA are "
          "not affected). Needs TLS to the master (--tls-ca) too");
ABSL_FLAG(std::string, data_tls_client_ca, "",
          "With --data-tls: ask data-plane clients for a certificate of this CA (mutual TLS)");
ABSL_FLAG(bool, data_tls_require_client_cert, false,
          "With --data-tls-client-ca: refuse data-plane clients without a certificate");
ABSL_FLAG(std::string, http_token_file, "",
          "File holding the bearer token that /metrics needs (e.g. Prometheus's reader token; "
          "/healthz and /readyz stay open); empty: no token asked");
ABSL_FLAG(bool, insecure, false,
          "Allow binding a non-loopback address without TLS to the master and credentials "
          "(logged as a warning)");

namespace {

std::string TokenDigest(const std::string& token) {
  std::string digest(SHA256_DIGEST_LENGTH, '\0');
  SHA256(reinterpret_cast<const unsigned char*>(token.data()), token.size(),
         reinterpret_cast<unsigned char*>(digest.data()));
  return digest;
}

// Pages refused by --http-token-file, as the master counts its own (surface="http").
struct HttpRefusals {
  std::atomic<uint64_t> no_credentials{0};
  std::atomic<uint64_t> unknown_token{0};

  std::vector<prometheus::MetricFamily> Collect() const {
    kvpool::MetricFamilies families;
    for (auto [reason, count] : {std::pair{"no_credentials", no_credentials.load()},
                                 std::pair{"unknown_token", unknown_token.load()}}) {
      families.Counter("kvpool_auth_refusals_total",
                       "HTTP pages refused for want of the --http-token-file token, by reason.",
                       static_cast<double>(count),
                       {{"surface", "http"}, {"method", "GET"}, {"reason", reason}});
    }
    return families.Take();
  }
};

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "kvpool-segment: %s\n", std::string(status.message()).c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  kvpool::BlockShutdownSignals();
  absl::SetProgramUsageMessage("Contributes this node's memory to a kvpool pool.");
  kvpool::ParseFlags(argc, argv);
  // Debian builds Abseil without NDEBUG, which leaves Mutex deadlock detection on: a lock
  // graph kept up to date at every acquisition (as in kvpool-master, where perf measured 6%
  // of its CPU). The unit tests keep it.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);

  uint64_t size = absl::GetFlag(FLAGS_size).bytes;
  if (size == 0) return Fail(absl::InvalidArgumentError("--size must be above 0"));

  kvpool::segment::SegmentOptions options;
  options.size = size;
  options.prefault = absl::GetFlag(FLAGS_prefault);
  options.hugepages = absl::GetFlag(FLAGS_hugepages);
  options.listen = absl::GetFlag(FLAGS_listen);
  options.advertise_host = absl::GetFlag(FLAGS_advertise_host);
  options.name = absl::GetFlag(FLAGS_name);
  options.data = {.threads = absl::GetFlag(FLAGS_threads),
                  .require_token = absl::GetFlag(FLAGS_require_token),
                  .max_connections = absl::GetFlag(FLAGS_max_connections),
                  .idle_timeout = absl::GetFlag(FLAGS_idle_timeout),
                  .request_timeout = absl::GetFlag(FLAGS_request_timeout)};
  options.master_address = absl::GetFlag(FLAGS_master);
  options.master_tls = kvpool::GetMasterLinkTlsFlags(/*environment=*/false);
  if (absl::Status tls = kvpool::ValidateClientTls(options.master_tls); !tls.ok()) {
    return Fail(tls);
  }
  if (absl::GetFlag(FLAGS_data_tls)) {
    if (!options.master_tls.enabled() || options.master_tls.cert_file.empty()) {
      return Fail(absl::InvalidArgumentError(
          "--data-tls needs --tls-cert and --tls-key (this segment's certificate) and --tls-ca "
          "(TLS to the master: the token secret the data plane checks comes over it)"));
    }
    kvpool::ServerTlsOptions tls{
        .cert_file = options.master_tls.cert_file,
        .key_file = options.master_tls.key_file,
        .client_ca_file = absl::GetFlag(FLAGS_data_tls_client_ca),
        .require_client_cert = absl::GetFlag(FLAGS_data_tls_require_client_cert),
        .reload_interval = options.master_tls.reload_interval};
    if (absl::Status valid = kvpool::ValidateServerTls(tls); !valid.ok()) return Fail(valid);
    options.data.tls = tls;
  } else if (!absl::GetFlag(FLAGS_data_tls_client_ca).empty() ||
             absl::GetFlag(FLAGS_data_tls_require_client_cert)) {
    return Fail(absl::InvalidArgumentError("--data-tls-client-ca needs --data-tls"));
  }
  absl::StatusOr<std::string> token = kvpool::GetAuthTokenFlag(/*environment=*/false);
  if (!token.ok()) return Fail(token.status());
  options.master_auth_token = *std::move(token);
  {
    // A segment is as safe as its master link: its grants come only over it.
    absl::StatusOr<kvpool::ExposureVerdict> verdict = kvpool::CheckExposure(
        {.listens = {{"--listen", options.listen},
                     {"--http-listen", absl::GetFlag(FLAGS_http_listen)}},
         .tls = options.master_tls.enabled(),
         .authenticated = !options.master_auth_token.empty() || !options.master_tls.cert_file.empty(),
         .insecure = absl::GetFlag(FLAGS_insecure)});
    if (!verdict.ok()) return Fail(verdict.status());
    if (verdict->warning) {
      KVPOOL_LOG(WARNING) << verdict->message;
    } else {
      KVPOOL_LOG(INFO) << verdict->message;
    }
  }
  options.rdma_device = absl::GetFlag(FLAGS_rdma_device);
  std::string shm_socket = absl::GetFlag(FLAGS_shm_socket);
  options.shm_socket = shm_socket == "none" ? "" : shm_socket;
  if (absl::Status uids = kvpool::segment::ParseAdmittedUids(absl::GetFlag(FLAGS_shm_uids),
                                                             &options.shm_admission);
      !uids.ok()) {
    return Fail(uids);
  }
  if (absl::Status group = kvpool::segment::ParseAdmittedGroup(absl::GetFlag(FLAGS_shm_group),
                                                               &options.shm_admission);
      !group.ok()) {
    return Fail(group);
  }
  options.verify_commits = absl::GetFlag(FLAGS_verify_commits);
  options.hash_shm_commits = absl::GetFlag(FLAGS_hash_shm_commits);
  options.print_mounts = true;
  options.on_drained = [] { kill(getpid(), SIGTERM); };
  absl::StatusOr<std::unique_ptr<kvpool::segment::Segment>> started =
      kvpool::segment::Segment::Start(std::move(options));
  if (!started.ok()) return Fail(started.status());
  kvpool::segment::Segment& segment = **started;

  kvpool::HttpServer http;
  HttpRefusals http_refusals;
  if (std::string path = absl::GetFlag(FLAGS_http_token_file); !path.empty()) {
    absl::StatusOr<std::string> token = kvpool::ReadTokenFile(path);
    if (!token.ok()) return Fail(token.status());
    // Compared as SHA-256 digests in constant time: no timing tells how much of a guess was
    // right.
    http.SetGate(
        [digest = TokenDigest(*token), &http_refusals](
            const kvpool::HttpRequest& request) -> std::optional<kvpool::HttpResponse> {
          if (!request.bearer_token) {
            http_refusals.no_credentials.fetch_add(1, std::memory_order_relaxed);
            return kvpool::HttpRefusal(absl::UnauthenticatedError(
                "HTTP refused: send \"Authorization: Bearer <token>\" (--http-token-file)"));
          }
          std::string presented = TokenDigest(*request.bearer_token);
          if (CRYPTO_memcmp(presented.data(), digest.data(), digest.size()) != 0) {
            http_refusals.unknown_token.fetch_add(1, std::memory_order_relaxed);
            return kvpool::HttpRefusal(absl::UnauthenticatedError("HTTP refused: unknown token"));
          }
          return std::nullopt;
        },
        {"/healthz", "/readyz"});
  }
  http.Handle("/healthz", [](const kvpool::HttpRequest&) {
    return kvpool::HttpResponse{200, "text/plain", "ok\n"};
  });
  http.Handle("/metrics", [&segment, &http_refusals](const kvpool::HttpRequest&) {
    std::vector<prometheus::MetricFamily> families = CollectSegmentMetrics(segment);
    for (prometheus::MetricFamily& family : http_refusals.Collect()) {
      families.push_back(std::move(family));
    }
    return kvpool::HttpResponse{200, "text/plain; version=0.0.4",
                                kvpool::SerializeMetrics(families)};
  });
  http.Handle("/readyz", [&segment](const kvpool::HttpRequest&) {
    return segment.mounted() ? kvpool::HttpResponse{200, "text/plain", "mounted\n"}
                          : kvpool::HttpResponse{503, "text/plain", "not mounted\n"};
  });
  if (absl::GetFlag(FLAGS_enable_test_hooks)) {
    kvpool::segment::MemoryPool* raw_pool = &segment.pool();
    http.Handle("/debug/corrupt", [raw_pool](const kvpool::HttpRequest& request) {
      uint64_t offset = 0;
      auto it = request.params.find("offset");
      if (it == request.params.end() || !absl::SimpleAtoi(it->second, &offset) ||
          offset >= raw_pool->size()) {
        return kvpool::HttpResponse{400, "text/plain", "need offset=N inside the pool\n"};
      }
      raw_pool->data()[offset] ^= 0xFF;
      KVPOOL_LOG(WARNING) << "test hook flipped the pool byte at " << offset;
      return kvpool::HttpResponse{200, "text/plain", "flipped\n"};
    });
  }
  absl::StatusOr<uint16_t> http_port = http.Start(absl::GetFlag(FLAGS_http_listen));
  if (!http_port.ok()) return Fail(http_port.status());

  std::printf(
      "kvpool-segment listening name=%s data=%s shm=%s http=%s pool_bytes=%llu hugepages=%s\n",
              segment.name().c_str(), segment.endpoint().c_str(),
              segment.shm_socket().empty() ? "none" : segment.shm_socket().c_str(),
              kvpool::FormatHostPort(kvpool::ParseHostPort(absl::GetFlag(FLAGS_http_listen))->host,
                                     *http_port)
                  .c_str(),
              static_cast<unsigned long long>(size), segment.pool().hugepages() ? "yes" : "no");
  std::fflush(stdout);

  int signal_number = kvpool::WaitForShutdownSignal();
  KVPOOL_LOG(INFO) << "signal " << signal_number << "; unmounting and stopping";
  segment.Stop();
  http.Stop();
  return 0;
}
