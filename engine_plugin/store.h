#pragma once

// An engine's handle on the pool, with the shape of Mooncake's MooncakeDistributedStore:
// a kvpool::Client, plus (when global_segment_size > 0) a segment hosted in this process
// that contributes that much memory to the pool, plus the buffers registered for transfers.
// The Python module's kvpool.Store / kvpool.MooncakeDistributedStore wraps it.
//
// Buffers given by address (BatchPut, BatchGet, ReadBytes, WriteBytes) may be host memory or
// CUDA device memory, as with Mooncake: device parts move through pinned host memory
// (DeviceStaging). A device buffer must hold its final bytes when a put is called; a get's
// device buffers hold theirs when it returns.
//
// Thread-safe. After Close() every call fails with FailedPrecondition (per key for batches).
//
// Errors per key are the client's (client/include/kvpool/client.h): AlreadyExists,
// ResourceExhausted (NO_AVAILABLE_HANDLE: the pool is under pressure), NotFound, ...

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/btree_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "engine_plugin/device_staging.h"
#include "engine_plugin/store_backend.h"
#include "engine_plugin/store_config.h"
#include "kvpool/client.h"
#include "server/segment/data_server.h"
#include "server/segment/segment.h"

namespace kvpool::engine {

class Store : public StoreBackend {
 public:
  // Connects to the master, then starts and mounts the in-process segment if
  // global_segment_size > 0. Unavailable if the master does not answer or does not accept
  // the segment; the client's other errors as they are. The in-process segment reaches the
  // master over the client's TLS settings (ClientOptions::tls_*) and authenticates with
  // `segment_auth_token` (a segment rule named as the segment: local_hostname with a port).
  static absl::StatusOr<std::unique_ptr<Store>> Open(const StoreConfig& config,
                                                     const ClientOptions& client_options = {},
                                                     const std::string& segment_auth_token = "");
  ~Store() override;
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  // --- StoreBackend ---
  std::vector<absl::StatusOr<bool>> BatchExist(absl::Span<const std::string> keys) override;
  // Stored with config.replica_num copies.
  std::vector<absl::Status> BatchPut(absl::Span<const PutItem> items) override;
  // With per-call options (replicas, pin, placement). InvalidArgument for an item with a part
  // that starts in device memory and runs past its allocation (nothing of it is read).
  std::vector<absl::Status> BatchPut(absl::Span<const PutItem> items, const PutOptions& options);
  std::vector<absl::StatusOr<uint64_t>> BatchGet(absl::Span<const GetItem> items) override;
  // Records [base, base + bytes) as transfer memory. Registering the same range again is a
  // no-op; InvalidArgument for a null or empty range or one that overlaps another.
  absl::Status RegisterBuffer(uint64_t base, uint64_t bytes) override;

  // NotFound if no buffer starts at `base`.
  absl::Status UnregisterBuffer(uint64_t base);
  // `bytes` bytes at `ptr`, host or device memory (InvalidArgument past a device allocation).
  absl::StatusOr<std::string> ReadBytes(uint64_t ptr, size_t bytes);
  absl::Status WriteBytes(uint64_t ptr, absl::string_view data);
  // Whether `ptr` is CUDA device memory (the CPU cannot touch it).
  bool OnDevice(uint64_t ptr);
  std::vector<std::pair<uint64_t, uint64_t>> RegisteredBuffers() const;

  absl::Status Put(absl::string_view key, absl::string_view value);
  absl::StatusOr<std::string> Get(absl::string_view key);
  absl::StatusOr<bool> Exists(absl::string_view key);
  absl::StatusOr<uint64_t> Size(absl::string_view key);
  // `force`: even objects a reader holds a lease on (else OBJECT_HAS_LEASE).
  absl::Status Remove(absl::string_view key, bool force = false);
  absl::StatusOr<uint64_t> RemoveAll(bool force = false);
  absl::StatusOr<ClusterStatus> GetClusterStatus();

  // Unmounts the in-process segment (its objects leave the pool) and drops the connection.
  // Safe to call twice.
  void Close() ABSL_LOCKS_EXCLUDED(mu_);
  bool closed() const ABSL_LOCKS_EXCLUDED(mu_);

  const StoreConfig& config() const { return config_; }
  // The client, or null once closed.
  std::shared_ptr<Client> client() const ABSL_LOCKS_EXCLUDED(mu_);
  // Name and data-plane statistics of the in-process segment, if there is one.
  std::optional<std::string> local_segment_name() const ABSL_LOCKS_EXCLUDED(mu_);
  std::optional<segment::DataServer::Stats> local_segment_stats() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  Store(StoreConfig config, std::shared_ptr<Client> client,
        std::unique_ptr<segment::Segment> segment);
  struct Registered {
    uint64_t bytes = 0;
    MemoryPlace place;
  };
  // Where each part of each item lives, in order, from the registered buffers (asking the
  // driver only for parts outside them); per item OK or why its parts cannot be used. Empty
  // when this process has no CUDA (every part is host memory).
  template <typename Item>
  std::vector<MemoryPlace> PlacesOf(absl::Span<const Item> items,
                                    std::vector<absl::Status>& item_status)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The place of the registered buffer holding [ptr, ptr + bytes), if one does.
  std::optional<MemoryPlace> RegisteredPlaceLocked(uint64_t ptr, uint64_t bytes) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const StoreConfig config_;
  mutable absl::Mutex mu_;
  std::shared_ptr<Client> client_ ABSL_GUARDED_BY(mu_);
  // A segment hosted in this process (Mooncake's global_segment_size), or null.
  std::shared_ptr<segment::Segment> segment_ ABSL_GUARDED_BY(mu_);
  absl::btree_map<uint64_t, Registered> buffers_ ABSL_GUARDED_BY(mu_);  // by base address
  DeviceStaging staging_{DeviceStaging::Options{}};
};

}  // namespace kvpool::engine
