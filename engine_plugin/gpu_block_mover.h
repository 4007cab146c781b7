#pragma once

// Moves whole blocks of an engine's GPU KV cache between the GPU and the pool (a
// BlockTransfer, block_transfer.h). For a segment on this machine a store gathers a block's
// segments straight into space reserved in that segment's pool (mapped through shared memory
// and registered with the CUDA driver) and a load scatters them straight from the pool into
// the cache: one copy each way, no staging buffer, no memcpy by the CPU. Keys whose space is
// on another machine (or every key, with force_remote) go through a pinned host buffer and the
// client's network transports: gather into it, then put; get into it, then scatter. The
// copies are the kernels' CopyBlocks (kernels/block_copy.cuh).
//
// One object per block (all segments of the block, in layout order), under the key the caller
// gives (TokenDatabase::KeyFor). Thread-safe: stores and loads have their own stream, staging
// and lock, so one thread may store while another loads; calls of one direction take turns.
//
// Checksums: stores commit through Client::BatchCommitLocal, which computes the object's
// XXH3-64 on the CPU over the pool memory the GPU just wrote; same-host loads are not checked
// against it (the GPU reads the pool directly); network loads are (the client checks them).

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "engine_plugin/block_transfer.h"
#include "engine_plugin/kv_cache_layout.h"
#include "kernels/block_copy.cuh"
#include "kernels/types.h"
#include "kvpool/client.h"

namespace kvpool::engine {

struct GpuBlockMoverOptions {
  // Streams for stores and for loads (not the legacy default stream; the same stream for both
  // serializes them). Null: the mover creates a non-blocking stream of its own for each.
  cudaStream_t store_stream = nullptr;
  cudaStream_t load_stream = nullptr;
  // Pinned host memory per direction for blocks that go over the network (at least one block).
  uint64_t pinned_staging_bytes = uint64_t{64} << 20;
  // Every key over the network, even where a same-host pool could take it (benchmarks, tests).
  bool force_remote = false;
};

class GpuBlockMover : public BlockTransfer {
 public:
  // `layout` describes memory of the current device (made current again on every thread
  // that stores or loads). Maps this machine's pools and
  // registers them with the driver. Internal for CUDA errors.
  static absl::StatusOr<std::unique_ptr<GpuBlockMover>> Create(Client& client,
                                                               const KvCacheLayout& layout,
                                                               GpuBlockMoverOptions options);
  // Loads and stores on `stream`, which must not be the legacy default stream.
  static absl::StatusOr<std::unique_ptr<GpuBlockMover>> Create(Client& client,
                                                               const KvCacheLayout& layout,
                                                               cudaStream_t stream);
  ~GpuBlockMover() override;

  // Stores block block_ids[i] under keys[i]. Per key: OK (stored, or already in the pool),
  // ResourceExhausted (pressure: back off), or the client's error for the network path.
  std::vector<absl::Status> StoreBlocks(absl::Span<const std::string> keys,
                                        absl::Span<const int32_t> block_ids)
      ABSL_LOCKS_EXCLUDED(store_.mu) override;

  // Loads keys[i] into block block_ids[i]. Per key: OK, NotFound, Aborted (LEASE_EXPIRED: the
  // copy outlasted the lease), InvalidArgument (not one block long), DataLoss (network path:
  // checksum mismatch), or the client's error.
  std::vector<absl::Status> LoadBlocks(absl::Span<const std::string> keys,
                                       absl::Span<const int32_t> block_ids)
      ABSL_LOCKS_EXCLUDED(load_.mu) override;

  uint64_t bytes_per_block() const { return bytes_per_block_; }

 private:
  // One batch of blocks on its way: what it moves, for whom, and when its copy is done.
  struct Batch {
    Batch();
    ~Batch();
    std::vector<int32_t> ids;
    std::vector<uint8_t*> objects;
    std::vector<size_t> owners;  // indices into the caller's keys
    std::vector<LocalReservation> reservations;  // stores
    absl::Time lease_expiry;                     // loads
    cudaEvent_t done = nullptr;
  };
  // What one direction owns: its stream, its device staging, its pinned buffer.
  struct Direction {
    absl::Mutex mu;
    cudaStream_t stream = nullptr;
    bool own_stream = false;
    kernels::CopyStaging staging;
    uint8_t* pinned = nullptr;
    uint64_t pinned_bytes = 0;
  };

  GpuBlockMover(Client& client, bool force_remote) : client_(client), force_remote_(force_remote) {}
  absl::Status SetUp(Direction& direction, cudaStream_t stream, uint64_t pinned_bytes);
  // Registers pools mapped since the last call with the CUDA driver.
  absl::Status RegisterNewPools() ABSL_LOCKS_EXCLUDED(pools_mu_);
  // Queues the batch's copy on the direction's stream and records its event.
  absl::Status Launch(Direction& direction, const Batch& batch, kernels::CopyDirection how);
  // The network path for keys[owners[k]] / block_ids[owners[k]], through the pinned buffer.
  void StoreRemote(absl::Span<const std::string> keys, absl::Span<const int32_t> block_ids,
                   absl::Span<const size_t> owners, std::vector<absl::Status>& results)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(store_.mu);
  void LoadRemote(absl::Span<const std::string> keys, absl::Span<const int32_t> block_ids,
                  absl::Span<const size_t> owners, std::vector<absl::Status>& results)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(load_.mu);

  Client& client_;
  const bool force_remote_;
  int device_ = 0;  // the device current at Create; made current on every calling thread
  std::vector<kernels::KvSegment> segments_;
  uint64_t bytes_per_block_ = 0;
  Direction store_;
  Direction load_;
  absl::Mutex pools_mu_;
  absl::flat_hash_set<uint8_t*> registered_ ABSL_GUARDED_BY(pools_mu_);
  // The pools this mover registered itself (so only these are unregistered at the end).
  std::vector<uint8_t*> owned_registrations_ ABSL_GUARDED_BY(pools_mu_);
};

}  // namespace kvpool::engine
