#pragma once

// Moves whole blocks of an engine's GPU KV cache between the GPU and the pool in one copy
// each way, with no staging buffer and no memcpy by the CPU: a store gathers a block's
// segments straight into space reserved in a same-machine segment's pool (mapped through
// shared memory and registered with the CUDA driver), a load scatters them straight from the
// pool into the cache. The copies are the kernels' CopyBlocks (kernels/block_copy.cuh).
//
// One object per block (all segments of the block, in layout order), under the key the caller
// gives (TokenDatabase::KeyFor). Needs a segment on this machine that admits the process;
// other keys get FailedPrecondition. Thread-compatible: one user at a time (one CUDA stream).

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine_plugin/kv_cache_layout.h"
#include "kernels/block_copy.cuh"
#include "kernels/types.h"
#include "kvpool/client.h"

namespace kvpool::engine {

class GpuBlockMover {
 public:
  // `layout` describes device memory. Maps this machine's pools and registers them with the
  // driver. `stream` must not be the legacy default stream.
  static absl::StatusOr<std::unique_ptr<GpuBlockMover>> Create(Client& client,
                                                               const KvCacheLayout& layout,
                                                               cudaStream_t stream);
  ~GpuBlockMover();

  // Stores block block_ids[i] under keys[i]. Per key: OK (stored, or already in the pool),
  // ResourceExhausted (pressure: back off), FailedPrecondition (no same-machine room).
  std::vector<absl::Status> StoreBlocks(absl::Span<const std::string> keys,
                                        absl::Span<const int32_t> block_ids);

  // Loads keys[i] into block block_ids[i]. Per key: OK, NotFound, FailedPrecondition (not on
  // a segment of this machine), Aborted (LEASE_EXPIRED: the copy outlasted the lease).
  std::vector<absl::Status> LoadBlocks(absl::Span<const std::string> keys,
                                       absl::Span<const int32_t> block_ids);

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

  GpuBlockMover(Client& client, cudaStream_t stream) : client_(client), stream_(stream) {}
  // Registers pools mapped since the last call with the CUDA driver.
  absl::Status RegisterNewPools();
  // Queues the batch's copy on the stream and records its event.
  absl::Status Launch(const Batch& batch, kernels::CopyDirection direction);

  Client& client_;
  cudaStream_t stream_;
  std::vector<kernels::KvSegment> segments_;
  uint64_t bytes_per_block_ = 0;
  kernels::CopyStaging staging_;
  absl::flat_hash_set<uint8_t*> registered_;
};

}  // namespace kvpool::engine
