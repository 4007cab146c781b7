#include "engine_plugin/local_segment.h"

#include <mutex>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/net.h"
#include "proto/capability.h"
#include "server/common/advertise.h"
#include "server/segment/master_link.h"
#include "server/segment/memory_pool.h"

namespace kvpool::engine {

struct LocalSegment::Impl {
  std::unique_ptr<segment::MemoryPool> pool;
  std::unique_ptr<segment::DataServer> server;
  std::unique_ptr<segment::MasterLink> link;
  std::string name;
  std::string endpoint;
  uint64_t size = 0;
  std::once_flag stopped;
};

LocalSegment::LocalSegment(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

LocalSegment::~LocalSegment() { Stop(); }

absl::StatusOr<std::unique_ptr<LocalSegment>> LocalSegment::Start(
    const LocalSegmentOptions& options) {
  if (options.size == 0) return absl::InvalidArgumentError("in-process segment size is 0");
  if (absl::StatusOr<HostPort> master = ParseHostPort(options.master_address); !master.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("master address: ", master.status().message()));
  }
  auto impl = std::make_unique<Impl>();
  impl->size = options.size;
  absl::StatusOr<std::unique_ptr<segment::MemoryPool>> pool =
      segment::MemoryPool::Create(options.size, options.prefault, "kvpool-engine-segment");
  if (!pool.ok()) return pool.status();
  impl->pool = std::move(*pool);

  std::string secret = wire::NewCapabilitySecret();
  impl->server = std::make_unique<segment::DataServer>(*impl->pool, secret,
                                                       segment::DataServerOptions{});
  absl::StatusOr<uint16_t> port =
      impl->server->Start(FormatHostPort(options.listen_host, options.listen_port));
  if (!port.ok()) return port.status();
  std::string host = AdvertisedHost(options.listen_host, options.advertise_host);
  impl->endpoint = FormatHostPort(host, *port);
  impl->name = absl::StrCat("engine@", impl->endpoint);

  segment::MasterLinkOptions link;
  link.master_address = options.master_address;
  link.name = impl->name;
  link.host = host;
  link.endpoint = impl->endpoint;
  link.size = options.size;
  link.incarnation = std::random_device{}() | (uint64_t{std::random_device{}()} << 32);
  link.token_secret = secret;
  impl->link = std::make_unique<segment::MasterLink>(std::move(link));
  impl->link->Start();

  absl::Time deadline = absl::Now() + options.mount_timeout;
  while (!impl->link->mounted()) {
    if (absl::Now() >= deadline) {
      impl->link->Stop();
      impl->server->Stop();
      return absl::UnavailableError(absl::StrCat("master ", options.master_address,
                                                 " did not accept the in-process segment within ",
                                                 absl::FormatDuration(options.mount_timeout)));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return std::unique_ptr<LocalSegment>(new LocalSegment(std::move(impl)));
}

void LocalSegment::Stop() {
  std::call_once(impl_->stopped, [this] {
    impl_->link->Stop();
    impl_->server->Stop();
  });
}

const std::string& LocalSegment::name() const { return impl_->name; }
const std::string& LocalSegment::endpoint() const { return impl_->endpoint; }
uint64_t LocalSegment::size() const { return impl_->size; }
bool LocalSegment::mounted() const { return impl_->link->mounted(); }
segment::DataServer::Stats LocalSegment::stats() const { return impl_->server->stats(); }

}  // namespace kvpool::engine
