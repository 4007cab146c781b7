#include "server/segment/segment.h"

#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/net.h"
#include "proto/capability.h"
#include "proto/checksum.h"
#include "proto/master_locator.h"
#include "server/common/advertise.h"

namespace kvpool::segment {

absl::StatusOr<std::unique_ptr<Segment>> Segment::Start(SegmentOptions options) {
  if (options.size == 0) return absl::InvalidArgumentError("segment size is 0");
  absl::StatusOr<HostPort> listen = ParseHostPort(options.listen);
  if (!listen.ok()) return listen.status();
  if (!options.master_address.empty()) {
    if (absl::StatusOr<std::unique_ptr<MasterLocator>> master =
            MasterLocator::Create(options.master_address);
        !master.ok()) {
      return master.status();
    }
  }
  std::unique_ptr<Segment> segment(new Segment());
  absl::StatusOr<std::unique_ptr<MemoryPool>> pool =
      MemoryPool::Create({.size = options.size,
                          .prefault = options.prefault,
                          .hugepages = options.hugepages,
                          .name = "kvpool-segment"});
  if (!pool.ok()) return pool.status();
  segment->pool_ = std::move(*pool);
  segment->incarnation_ = std::random_device{}() | (uint64_t{std::random_device{}()} << 32);
  if (options.rdma_device != "none") {
    if (absl::Status rdma = segment->StartRdma(options.rdma_device, options.data); !rdma.ok()) {
      KVPOOL_LOG(INFO) << "no RDMA for this segment (" << rdma.message()
                       << "); serving TCP and shared memory";
    }
  }
  // Payloads are hashed as they land only where a commit will be checked against the hash.
  options.data.checksum_writes = options.verify_commits && !options.master_address.empty();
  // The server exists before the first record reaches the manifest.
  segment->manifest_ =
      std::make_unique<Manifest>([raw = segment.get()](uint64_t offset, uint64_t size) {
        raw->server_->grants().CutKeyReads(offset, size);
      });
  options.data.manifest = segment->manifest_.get();
  if (!options.master_address.empty()) {
    options.data.key_reads_allowed = [raw = segment.get()](absl::Time now) {
      const MasterLink* link = raw->linked_.load(std::memory_order_acquire);
      return link != nullptr && link->in_touch(now);
    };
  }
  segment->server_ = std::make_unique<DataServer>(*segment->pool_, wire::NewCapabilitySecret(),
                                                  options.data);
  absl::StatusOr<uint16_t> port = segment->server_->Start(options.listen);
  if (!port.ok()) return port.status();
  segment->host_ = AdvertisedHost(listen->host, options.advertise_host);
  segment->endpoint_ = FormatHostPort(segment->host_, *port);
  segment->name_ = options.name.empty() ? segment->endpoint_ : options.name;
  if (!options.shm_socket.empty()) {
    ShmAdmissionOptions admission = options.shm_admission;
    admission.incarnation = segment->incarnation_;
    admission.socket_path = options.shm_socket == "auto"
                                ? absl::StrCat("/tmp/kvpool-segment-", *port, ".sock")
                                : options.shm_socket;
    segment->shm_ = std::make_unique<ShmAdmission>(*segment->pool_, segment->server_->grants(),
                                                   std::move(admission));
    if (absl::Status started = segment->shm_->Start(); !started.ok()) return started;
  }
  if (options.master_address.empty()) return segment;

  MasterLinkOptions link;
  link.master_address = options.master_address;
  link.tls = options.master_tls;
  link.auth_token = options.master_auth_token;
  link.name = segment->name_;
  link.host = segment->host_;
  link.endpoint = segment->endpoint_;
  link.shm_socket = segment->shm_socket();
  link.size = options.size;
  link.incarnation = segment->incarnation_;
  link.print_mounts = options.print_mounts;
  link.on_drained = std::move(options.on_drained);
  link.hash_shm_commits = options.hash_shm_commits;
  if (options.verify_commits) {
    link.holds_bytes = [pool = segment->pool_.get()](uint64_t offset, uint64_t size,
                                                     uint64_t checksum) {
      if (offset > pool->size() || size > pool->size() - offset) return false;
      iovec range{pool->data() + offset, size};
      return wire::Checksum({&range, 1}) == checksum;
    };
  }
  segment->link_ = std::make_unique<MasterLink>(std::move(link), *segment->manifest_,
                                                segment->server_->grants());
  segment->linked_.store(segment->link_.get(), std::memory_order_release);
  segment->link_->Start();

  if (options.mount_timeout > absl::ZeroDuration()) {
    absl::Time deadline = absl::Now() + options.mount_timeout;
    while (!segment->link_->mounted()) {
      if (absl::Now() >= deadline) {
        return absl::UnavailableError(absl::StrCat(
            "master ", options.master_address, " did not accept segment ", segment->name_,
            " within ", absl::FormatDuration(options.mount_timeout)));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  return segment;
}

absl::Status Segment::StartRdma(const std::string& device_name, DataServerOptions& data) {
  absl::StatusOr<std::shared_ptr<rdma::Device>> device = rdma::Device::Open(device_name);
  if (!device.ok()) return device.status();
  absl::StatusOr<std::shared_ptr<rdma::MemoryRegion>> region =
      (*device)->Register(pool_->data(), pool_->size(), /*remote=*/true);
  if (!region.ok()) return region.status();
  rdma_ = std::move(*device);
  pool_region_ = std::move(*region);
  data.rdma_accept = [device = rdma_, region = pool_region_](const rdma::QueuePairInfo& client)
      -> absl::StatusOr<RdmaAccept> {
    absl::StatusOr<std::unique_ptr<rdma::QueuePair>> pair = device->CreateQueuePair();
    if (!pair.ok()) return pair.status();
    if (absl::Status connected = (*pair)->Connect(client); !connected.ok()) return connected;
    RdmaAccept accept;
    accept.info = (*pair)->local();
    accept.info.addr = region->addr();
    accept.info.rkey = region->rkey();
    accept.queue_pair = std::shared_ptr<rdma::QueuePair>(std::move(*pair));
    return accept;
  };
  KVPOOL_LOG(INFO) << "serving the pool over RDMA on " << rdma_->name();
  return absl::OkStatus();
}

void Segment::ApplyRecord(bool add, const std::string& key, uint64_t offset, uint64_t size,
                          uint64_t checksum, uint64_t grant, absl::Time until) {
  v1::ManifestRecord record;
  record.set_kind(add ? v1::ManifestRecord::ADD : v1::ManifestRecord::FORGET);
  record.set_key(key);
  record.set_offset(offset);
  record.set_size(size);
  record.set_checksum(checksum);
  record.set_grant(grant);
  // A FORGET leaves the manifest (cutting reads by key) before its grant ends.
  if (!add) manifest_->Apply({record});
  server_->grants().End(grant, /*writes_only=*/add, until);
  if (add) manifest_->Apply({record});
}

Segment::~Segment() { Stop(); }

void Segment::Stop() {
  if (link_) link_->Stop();
  if (shm_) shm_->Stop();
  if (server_) server_->Stop();
}

}  // namespace kvpool::segment
