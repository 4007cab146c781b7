#include "server/segment/master_link.h"

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "grpcpp/grpcpp.h"
#include "kvpool/v1/master.grpc.pb.h"
#include "proto/channel.h"

namespace kvpool::segment {

struct MasterLink::Rpc {
  std::unique_ptr<v1::MasterService::Stub> stub;
};

MasterLink::MasterLink(MasterLinkOptions options)
    : options_(std::move(options)), rpc_(std::make_unique<Rpc>()) {
  rpc_->stub = v1::MasterService::NewStub(MakeMasterChannel(options_.master_address));
}

MasterLink::~MasterLink() { Stop(); }

void MasterLink::Start() { thread_ = std::thread([this] { Loop(); }); }

void MasterLink::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
  if (mounted_.exchange(false)) Unmount();
}

void MasterLink::Loop() {
  bool failing = false;
  while (true) {
    absl::Status status = mounted_.load() ? Heartbeat() : Mount();
    if (!status.ok() && !failing) {
      // Logged once per outage, not once per retry.
      KVPOOL_LOG(WARNING) << status.message() << "; retrying";
    } else if (status.ok() && failing) {
      KVPOOL_LOG(INFO) << "master " << options_.master_address << " answers again";
    }
    failing = !status.ok();
    absl::Duration wait = mounted_.load() ? heartbeat_interval_ : options_.retry_interval;
    absl::MutexLock lock(&mu_);
    if (mu_.AwaitWithTimeout(absl::Condition(&stopping_), wait)) return;
  }
}

absl::Status MasterLink::Mount() {
  v1::MountSegmentRequest request;
  request.set_name(options_.name);
  request.set_host(options_.host);
  request.set_endpoint(options_.endpoint);
  request.set_size(options_.size);
  request.set_incarnation(options_.incarnation);
  request.set_token_secret(options_.token_secret);
  v1::MountSegmentResponse response;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + options_.rpc_timeout));
  grpc::Status status = rpc_->stub->MountSegment(&context, request, &response);
  if (!status.ok()) {
    return absl::UnavailableError(absl::StrCat("mount on master ", options_.master_address,
                                               " failed: ", status.error_message()));
  }
  if (response.heartbeat_interval_ms() > 0) {
    heartbeat_interval_ = absl::Milliseconds(response.heartbeat_interval_ms());
  }
  mounted_.store(true);
  mount_count_.fetch_add(1);
  KVPOOL_LOG(INFO) << "mounted on master " << options_.master_address << " as " << options_.name;
  std::printf("kvpool-segment mounted master=%s\n", options_.master_address.c_str());
  std::fflush(stdout);
  return absl::OkStatus();
}

absl::Status MasterLink::Heartbeat() {
  v1::HeartbeatRequest request;
  request.set_name(options_.name);
  request.set_incarnation(options_.incarnation);
  v1::HeartbeatResponse response;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + options_.rpc_timeout));
  grpc::Status status = rpc_->stub->Heartbeat(&context, request, &response);
  if (!status.ok()) {
    return absl::UnavailableError(absl::StrCat("heartbeat to master ", options_.master_address,
                                               " failed: ", status.error_message()));
  }
  if (!response.known()) {
    KVPOOL_LOG(WARNING) << "master " << options_.master_address
                        << " does not know this segment; mounting again";
    mounted_.store(false);
    return Mount();
  }
  return absl::OkStatus();
}

void MasterLink::Unmount() {
  v1::UnmountSegmentRequest request;
  request.set_name(options_.name);
  request.set_incarnation(options_.incarnation);
  v1::UnmountSegmentResponse response;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + options_.rpc_timeout));
  grpc::Status status = rpc_->stub->UnmountSegment(&context, request, &response);
  if (status.ok()) {
    KVPOOL_LOG(INFO) << "unmounted from master; " << response.objects_dropped()
                     << " objects lost their last replica";
  } else {
    KVPOOL_LOG(WARNING) << "unmount failed: " << status.error_message();
  }
}

}  // namespace kvpool::segment
