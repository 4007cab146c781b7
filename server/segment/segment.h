#pragma once

// A running segment: its memory pool, the manifest of what it holds, the data-plane server
// that serves the pool, and (unless embedded in the master) the link that keeps it mounted.
// kvpool-segment runs one; kvpool-master runs one embedded; an engine may host one in its
// own process (Mooncake's global_segment_size). Thread-safe.

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/segment/data_server.h"
#include "server/segment/master_link.h"
#include "server/segment/memory_pool.h"
#include "server/segment/shm_admission.h"

namespace kvpool::segment {

struct SegmentOptions {
  uint64_t size = 0;
  // Touch every page at start, so first writes pay no page faults.
  bool prefault = true;
  // Back the pool with 2 MiB huge pages (see MemoryPoolOptions::hugepages).
  bool hugepages = false;
  // Data-plane address, "ip:port" (port 0: any free port).
  std::string listen = "127.0.0.1:0";
  // Host clients dial (default: the listen host, or this machine's name for a wildcard).
  std::string advertise_host;
  // Unique in the cluster (default: the advertised host:port).
  std::string name;
  DataServerOptions data;
  // Unix socket for same-host clients to map the pool: a path, "auto" (one in /tmp named
  // after the data port), or empty for no shared memory; and who may (see ShmAdmission).
  std::string shm_socket;
  ShmAdmissionOptions shm_admission;
  // RDMA device to serve one-sided READ/WRITE of the pool from: a name, empty for the first
  // one, "none" for no RDMA. Without a device the segment serves TCP and shared memory only.
  std::string rdma_device = "none";
  // gRPC address of the master to mount on; empty for a segment embedded in the master,
  // which the master mounts itself (no link) and tells of its objects directly (ApplyRecord).
  std::string master_address;
  // TLS and the bearer token for the master (MasterLinkOptions::tls, auth_token).
  ClientTlsOptions master_tls;
  std::string master_auth_token;
  // If above zero, Start() waits this long for the first mount (Unavailable if it fails).
  absl::Duration mount_timeout = absl::ZeroDuration();
  // Refuse a commit whose range does not hash to its checksum (MasterLinkOptions::holds_bytes).
  bool verify_commits = true;
  // Hash a range written by shared memory at commit too, instead of taking its done write
  // intent as the check (MasterLinkOptions::hash_shm_commits).
  bool hash_shm_commits = false;
  // Print "kvpool-segment mounted ..." on stdout at every mount (the daemon's readiness line).
  bool print_mounts = false;
  std::function<void()> on_drained;
};

class Segment {
 public:
  // InvalidArgument for a size of 0 or a bad address, ResourceExhausted if the memory cannot
  // be had, Unavailable if the address cannot be bound or the mount does not happen in time.
  static absl::StatusOr<std::unique_ptr<Segment>> Start(SegmentOptions options);
  ~Segment();
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;

  // Unmounts (best effort) and stops serving. Safe to call twice.
  void Stop();

  const std::string& name() const { return name_; }
  const std::string& host() const { return host_; }
  // Data-plane endpoint clients dial, "host:port".
  const std::string& endpoint() const { return endpoint_; }
  uint64_t size() const { return pool_->size(); }
  // The secret the master signs this segment's capability tokens with in the current term
  // (a segment with a master link draws a new one at every mount).
  std::string token_secret() const { return server_->grants().secret(); }
  // For a segment embedded in the master, which is told directly instead of through
  // heartbeats: an object committed here (`add`: its grant's writes end, and it is kept in
  // the manifest for reads by key) or forgotten (it leaves the manifest, then its grant ends).
  void ApplyRecord(bool add, const std::string& key, uint64_t offset, uint64_t size,
                   uint64_t checksum, uint64_t grant, absl::Time until);
  const GrantTable& grants() const { return server_->grants(); }
  MemoryPool& pool() { return *pool_; }
  const Manifest& manifest() const { return *manifest_; }
  // For a segment embedded in the master: the keys it served by key since the last call
  // (Manifest::TakeReads), which the master counts as uses, in place of a heartbeat's report.
  std::vector<std::string> TakeKeysRead() { return manifest_->TakeReads(); }
  // Always true for an embedded segment.
  bool mounted() const { return link_ == nullptr || link_->mounted(); }
  // Null for a segment embedded in the master.
  const MasterLink* link() const { return link_.get(); }
  DataServer::Stats stats() const { return server_->stats(); }
  // Random, drawn at Start: tells this run of the segment from a restarted one.
  uint64_t incarnation() const { return incarnation_; }
  // Empty when shared memory is off.
  std::string shm_socket() const { return shm_ ? shm_->socket_path() : ""; }
  const ShmAdmission* shm() const { return shm_.get(); }
  // Null when RDMA is off.
  const rdma::Device* rdma() const { return rdma_.get(); }

 private:
  Segment() = default;
  // Registers the pool with an RDMA device and lets `data` accept queue pairs.
  absl::Status StartRdma(const std::string& device_name, DataServerOptions& data);

  std::string name_;
  std::string host_;
  std::string endpoint_;
  uint64_t incarnation_ = 0;
  std::unique_ptr<MemoryPool> pool_;
  std::shared_ptr<rdma::Device> rdma_;
  std::shared_ptr<rdma::MemoryRegion> pool_region_;
  // Cuts reads by key of what leaves it (GrantTable::CutKeyReads).
  std::unique_ptr<Manifest> manifest_;
  std::unique_ptr<DataServer> server_;
  std::unique_ptr<ShmAdmission> shm_;
  std::unique_ptr<MasterLink> link_;
  // link_, for the data server's threads, which start before it is made.
  std::atomic<const MasterLink*> linked_{nullptr};
};

}  // namespace kvpool::segment
