#include "server/segment/segment.h"

#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/net.h"
#include "proto/capability.h"
#include "server/common/advertise.h"

namespace kvpool::segment {

absl::StatusOr<std::unique_ptr<Segment>> Segment::Start(SegmentOptions options) {
  if (options.size == 0) return absl::InvalidArgumentError("segment size is 0");
  absl::StatusOr<HostPort> listen = ParseHostPort(options.listen);
  if (!listen.ok()) return listen.status();
  if (!options.master_address.empty()) {
    if (absl::StatusOr<HostPort> master = ParseHostPort(options.master_address); !master.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("master address: ", master.status().message()));
    }
  }
  std::unique_ptr<Segment> segment(new Segment());
  absl::StatusOr<std::unique_ptr<MemoryPool>> pool =
      MemoryPool::Create(options.size, options.prefault, "kvpool-segment");
  if (!pool.ok()) return pool.status();
  segment->pool_ = std::move(*pool);
  segment->secret_ = wire::NewCapabilitySecret();
  segment->incarnation_ = std::random_device{}() | (uint64_t{std::random_device{}()} << 32);
  segment->server_ = std::make_unique<DataServer>(*segment->pool_, segment->secret_, options.data,
                                                  options.master_address.empty()
                                                      ? nullptr
                                                      : &segment->manifest_);
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
    segment->shm_ = std::make_unique<ShmAdmission>(*segment->pool_, std::move(admission));
    if (absl::Status started = segment->shm_->Start(); !started.ok()) return started;
  }
  if (options.master_address.empty()) return segment;

  MasterLinkOptions link;
  link.master_address = options.master_address;
  link.name = segment->name_;
  link.host = segment->host_;
  link.endpoint = segment->endpoint_;
  link.shm_socket = segment->shm_socket();
  link.size = options.size;
  link.incarnation = segment->incarnation_;
  link.token_secret = segment->secret_;
  link.print_mounts = options.print_mounts;
  link.on_drained = std::move(options.on_drained);
  segment->link_ = std::make_unique<MasterLink>(std::move(link), segment->manifest_);
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

Segment::~Segment() { Stop(); }

void Segment::Stop() {
  if (link_) link_->Stop();
  if (shm_) shm_->Stop();
  if (server_) server_->Stop();
}

}  // namespace kvpool::segment
