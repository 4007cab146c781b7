// kvpool-segment: contributes this node's memory to the pool. Allocates the pool, serves
// reads and writes of it over TCP, and keeps it mounted on the master.

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <random>

#include "absl/flags/flag.h"
#include "common/flags.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/net.h"
#include "common/size.h"
#include "proto/capability.h"
#include "server/common/advertise.h"
#include "server/common/http_server.h"
#include "server/common/signals.h"
#include "server/segment/data_server.h"
#include "server/segment/manifest.h"
#include "server/segment/master_link.h"
#include "server/segment/memory_pool.h"

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
ABSL_FLAG(bool, enable_test_hooks, false,
          "Serve /debug/corrupt?offset=N on the HTTP port (flips a pool byte; tests only)");
ABSL_FLAG(bool, require_token, true,
          "Serve only ranges granted by the master's capability tokens (turn off only in "
          "benchmarks of the raw data plane)");

namespace {

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "kvpool-segment: %s\n", std::string(status.message()).c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  kvpool::BlockShutdownSignals();
  absl::SetProgramUsageMessage("Contributes this node's memory to a kvpool pool.");
  kvpool::ParseFlags(argc, argv);

  uint64_t size = absl::GetFlag(FLAGS_size).bytes;
  if (size == 0) return Fail(absl::InvalidArgumentError("--size must be above 0"));
  absl::StatusOr<kvpool::HostPort> listen = kvpool::ParseHostPort(absl::GetFlag(FLAGS_listen));
  if (!listen.ok()) return Fail(listen.status());

  absl::StatusOr<std::unique_ptr<kvpool::segment::MemoryPool>> pool =
      kvpool::segment::MemoryPool::Create(size, absl::GetFlag(FLAGS_prefault), "kvpool-segment");
  if (!pool.ok()) return Fail(pool.status());

  std::string secret = kvpool::wire::NewCapabilitySecret();
  kvpool::segment::Manifest manifest;
  kvpool::segment::DataServer data_server(
      **pool, secret,
      {.threads = absl::GetFlag(FLAGS_threads), .require_token = absl::GetFlag(FLAGS_require_token)},
      &manifest);
  absl::StatusOr<uint16_t> data_port = data_server.Start(absl::GetFlag(FLAGS_listen));
  if (!data_port.ok()) return Fail(data_port.status());

  std::string host = kvpool::AdvertisedHost(listen->host, absl::GetFlag(FLAGS_advertise_host));
  std::string endpoint = kvpool::FormatHostPort(host, *data_port);
  std::string name = absl::GetFlag(FLAGS_name).empty() ? endpoint : absl::GetFlag(FLAGS_name);

  kvpool::segment::MasterLinkOptions link_options;
  link_options.master_address = absl::GetFlag(FLAGS_master);
  link_options.name = name;
  link_options.host = host;
  link_options.endpoint = endpoint;
  link_options.size = size;
  link_options.incarnation = std::random_device{}() | (uint64_t{std::random_device{}()} << 32);
  link_options.token_secret = secret;
  link_options.on_drained = [] { kill(getpid(), SIGTERM); };
  kvpool::segment::MasterLink link(std::move(link_options), manifest);

  kvpool::HttpServer http;
  http.Handle("/healthz", [](const kvpool::HttpRequest&) {
    return kvpool::HttpResponse{200, "text/plain", "ok\n"};
  });
  http.Handle("/readyz", [&link](const kvpool::HttpRequest&) {
    return link.mounted() ? kvpool::HttpResponse{200, "text/plain", "mounted\n"}
                          : kvpool::HttpResponse{503, "text/plain", "not mounted\n"};
  });
  if (absl::GetFlag(FLAGS_enable_test_hooks)) {
    kvpool::segment::MemoryPool* raw_pool = pool->get();
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

  std::printf("kvpool-segment listening name=%s data=%s http=%s pool_bytes=%llu\n", name.c_str(),
              endpoint.c_str(),
              kvpool::FormatHostPort(kvpool::ParseHostPort(absl::GetFlag(FLAGS_http_listen))->host,
                                     *http_port)
                  .c_str(),
              static_cast<unsigned long long>(size));
  std::fflush(stdout);
  link.Start();

  int signal_number = kvpool::WaitForShutdownSignal();
  KVPOOL_LOG(INFO) << "signal " << signal_number << "; unmounting and stopping";
  link.Stop();
  http.Stop();
  data_server.Stop();
  return 0;
}
