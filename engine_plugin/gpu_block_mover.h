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
// Checksums (gpu_checksums, the default): a same-host store hashes each block object on the GPU
// from the cache itself (kernels/checksum.cuh, the store's XXH3-64, bit-identical to the CPU's)
// while the copy runs, and commits with that checksum (Client::BatchCommitLocal then hashes
// nothing); a same-host load hashes each block on the GPU right after scattering it into the
// cache and compares it with the checksum its writer recorded: a block that differs is DataLoss
// (recompute it; its bytes in the cache are not to be used). Neither makes a pass of the CPU
// over pool memory. Without gpu_checksums, BatchCommitLocal hashes the pool memory on the CPU
// and same-host loads are not checked. The network path is checked by the client either way.

#include <cuda_runtime_api.h>

#include <cstdint>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/task_pool.h"
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
  // Pinned host memory per direction for blocks that go over the network (at least one block;
  // for stores, at least staged_first_batch_blocks, up to 256 MiB).
  uint64_t pinned_staging_bytes = uint64_t{64} << 20;
  // Every key over the network, even where a same-host pool could take it (benchmarks, tests).
  bool force_remote = false;
  // Same-host checksums on the GPU (see above); false: on the CPU at commit, loads unchecked.
  // Layouts of more than kernels::kMaxChecksumSegments segments use the CPU either way.
  bool gpu_checksums = true;
  // A layer-wise load copies groups of consecutive layers, each at least this many bytes of a
  // block (the copy engines reach full speed on pieces of 256 KiB and more; smaller pieces go
  // through the SMs, which the engine's layers need then). 0: every layer on its own.
  uint64_t layerwise_group_bytes = kernels::kAutoStagedMinObjectBytes;
  // The share of a layer-wise load's blocks copied layer group by layer group (the last ones);
  // the others are copied whole as soon as they are located, so the copies start at the
  // master's first answer. The engine's first layer can run once the head and the tail's
  // first group are in: with a step of C ms over a load of T ms, a tail of at least C / T
  // hides the step behind the copies. 1: every block by groups.
  double layerwise_tail = 0.5;
  // ... and at most this many bytes of blocks: a tail larger than the step needs only costs
  // (each group is another round of copies per block, queued on the caller's thread, and the
  // engine's stream waits for the head anyway). On an H200, the Llama-3.1-8B shape at 32k
  // tokens (4 GiB) reached the first token 2 ms sooner with a tail of 1 GiB than of 2 GiB,
  // while 8k (1 GiB) needs the whole half (docs/benchmarks.md). 0: no limit.
  uint64_t layerwise_tail_max_bytes = uint64_t{1} << 30;
  // How a call's keys are cut into batches (one pool round trip and one CopyBlocks each): a
  // short first batch (a load's; a store's is staged_first_batch_blocks), so that the GPU
  // starts copying after one short round trip, then batch_blocks each; the last batch at most
  // last_batch_blocks (0: what remains), so that the commit a store waits for after its last
  // copy is a short one.
  size_t first_batch_blocks = 32;
  size_t batch_blocks = 128;
  size_t last_batch_blocks = 0;
  // A store's first batch instead, copied into the pinned buffer before its space is known
  // (then into its space by the CPU, beside the later batches' copies), so that the GPU
  // starts at once and has work until the next batches' space is known (at most 256 MiB of
  // blocks: fewer blocks of larger ones). 0: none (stores are cut as loads are). Measured on
  // H100 hosts (docs/benchmarks.md): 64 blocks of 2 MiB took 1 GiB stores from 0.78x-0.87x of
  // a pinned copy to 0.87x-0.90x.
  size_t staged_first_batch_blocks = 64;
  // Threads kept parked for the batches' round trips (reservations, commits, lookups), so that
  // a call wakes one instead of starting one per batch. A call of more batches than this (a
  // 4 GiB load of 2 MiB blocks is 17) queues the rest behind the first.
  int round_trip_threads = 32;
};

// Where a direction's calls spent their time so far (wall clock of the calling thread):
// asking the master (reserve or locate), queuing the GPU's work, waiting for it, committing.
struct MoverPhaseTimes {
  absl::Duration master;
  absl::Duration launch;
  absl::Duration wait;
  absl::Duration commit;  // stores
  absl::Duration total;
  // Of the total: from the call until the first copy was queued (the first answer of the
  // master; for a store that stages its first batch, that batch's copy into the pinned
  // buffer), and, for stores, from the end of the last copy until the call returned (the last
  // commit). What a call adds to its copies is mostly these two.
  absl::Duration to_first_copy;
  absl::Duration after_last_copy;
  uint64_t calls = 0;
  uint64_t blocks = 0;
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
  // copy outlasted the lease), InvalidArgument (not one block long), DataLoss (the bytes loaded
  // do not match the writer's checksum: recompute the block), or the client's error.
  std::vector<absl::Status> LoadBlocks(absl::Span<const std::string> keys,
                                       absl::Span<const int32_t> block_ids)
      ABSL_LOCKS_EXCLUDED(load_.mu) override;

  // A load queued layer by layer (block_transfer.h): every batch located at once; the head
  // of the blocks (all but the last layerwise_tail, at most layerwise_tail_max_bytes of them)
  // copied whole as batches are located, then the tail group of layers by group of layers,
  // each group's end an event that WaitForLayer makes the engine's stream wait on; with
  // gpu_checksums, the blocks are hashed on the GPU (beside the engine's work) once all landed
  // and checked at Finish. Keys whose pool is on another machine are loaded (through staging)
  // before this returns. One at a time per mover: while one is unfinished, another fails
  // every key with FailedPrecondition. Layers: the layout's tensors (segment_tensors), so a
  // cross-layer cache loads as one layer; they are copied in groups (layerwise_group_bytes),
  // and a layer's wait is its group's.
  std::unique_ptr<LayerwiseLoad> StartLayerwiseLoad(absl::Span<const std::string> keys,
                                                    absl::Span<const int32_t> block_ids)
      ABSL_LOCKS_EXCLUDED(load_.mu) override;
  absl::Status WaitForLayer(int layer, uintptr_t stream) override;
  // Locates the keys now (one master round trip per batch, side by side) and keeps, for each
  // key with a replica on a pool of this machine, its leased location: the next load of the
  // key takes it instead of asking the master, while at least kLocatedMargin of its lease is
  // left (else it asks again). Keys on another machine's pool count as present. nullopt with
  // force_remote (nothing to keep). Keeps at most kMaxLocated keys.
  std::optional<std::vector<bool>> Locate(absl::Span<const std::string> keys)
      ABSL_LOCKS_EXCLUDED(located_mu_) override;
  static constexpr absl::Duration kLocatedMargin = absl::Seconds(1);
  static constexpr size_t kMaxLocated = size_t{1} << 16;
  int num_layers() const { return static_cast<int>(group_of_layer_.size()); }

  uint64_t bytes_per_block() const { return bytes_per_block_; }
  MoverPhaseTimes store_times() ABSL_LOCKS_EXCLUDED(store_.mu);
  MoverPhaseTimes load_times() ABSL_LOCKS_EXCLUDED(load_.mu);

 private:
  class Layerwise;
  friend class Layerwise;
  // Finishes the layer-wise load in flight (Layerwise::Finish).
  std::vector<absl::Status> FinishLayerwise(Layerwise& load) ABSL_LOCKS_EXCLUDED(load_.mu);

  // One batch of blocks on its way: what it moves, for whom, and when its copy is done.
  struct Batch {
    Batch();
    ~Batch();
    std::vector<int32_t> ids;
    std::vector<uint8_t*> objects;
    std::vector<size_t> owners;  // indices into the caller's keys
    std::vector<LocalReservation> reservations;  // stores
    absl::Time lease_expiry;                     // loads
    std::vector<uint64_t> expected;              // loads: the writers' checksums (0: none)
    uint64_t* sums = nullptr;  // [ids.size()] the GPU's checksums (pinned), or null: none
    cudaEvent_t done = nullptr;    // the copy
    cudaEvent_t summed = nullptr;  // the checksums (when sums)
    absl::Time copied;             // stores: when the copy (and checksums) was seen done
    // A store's head (its first batch, StoreBlocks): the GPU copied its blocks into the pinned
    // buffer before their space was known. reservations[k]'s block is number head_slot[k] there
    // (and its checksum sums[head_slot[k]]), copied into objects[k] by the CPU before the commit.
    std::vector<uint32_t> head_slot;
  };
  // One batch's lookup on its way (LocateBatches): keys [first, first + n).
  struct Located {
    size_t first = 0;
    size_t n = 0;
    absl::Time lease_expiry;
    std::future<std::vector<absl::StatusOr<LocalValue>>> values;
  };
  // [first, count) of each batch of a call of `count` keys (the options' batch sizes, the
  // first batch `first_batch` keys).
  std::vector<std::pair<size_t, size_t>> Batches(size_t count, size_t first_batch) const;
  // Asks the master for every batch at once, each on a thread of round_trips_, for the keys whose
  // location Locate did not keep (`kept`: take those). None with force_remote. The Located
  // must not move until its values are taken.
  std::vector<Located> LocateBatches(absl::Span<const std::string> keys,
                                     const std::vector<std::pair<size_t, size_t>>& spans,
                                     bool kept = true) ABSL_LOCKS_EXCLUDED(located_mu_);
  // A location Locate kept.
  struct KeptLocation {
    LocalValue value;
    absl::Time lease_expiry;
  };

  // What one direction owns: its stream, its device staging, its pinned buffer.
  struct Direction {
    absl::Mutex mu;
    cudaStream_t stream = nullptr;
    bool own_stream = false;
    // Checksums run here, beside the copies (which never wait for them).
    cudaStream_t sum_stream = nullptr;
    kernels::CopyStaging staging;
    uint8_t* pinned = nullptr;
    uint64_t pinned_bytes = 0;
    uint64_t* sums = nullptr;  // pinned, one checksum per key of a call
    size_t sums_capacity = 0;
    MoverPhaseTimes times;
  };

  GpuBlockMover(Client& client, const GpuBlockMoverOptions& options, bool gpu_checksums)
      : client_(client),
        force_remote_(options.force_remote),
        gpu_checksums_(gpu_checksums),
        first_batch_(std::max<size_t>(1, options.first_batch_blocks)),
        batch_(std::max<size_t>(1, options.batch_blocks)),
        last_batch_(options.last_batch_blocks),
        staged_first_batch_(options.staged_first_batch_blocks),
        round_trips_(std::max(1, options.round_trip_threads)) {}
  absl::Status SetUp(Direction& direction, cudaStream_t stream, uint64_t pinned_bytes);
  // Registers pools mapped since the last call with the CUDA driver.
  absl::Status RegisterNewPools() ABSL_LOCKS_EXCLUDED(pools_mu_);
  // Queues the batch's copy on the direction's stream and records its event.
  absl::Status Launch(Direction& direction, const Batch& batch, kernels::CopyDirection how);
  // Queues the checksums of the batch's blocks (as they are in the cache) into batch.sums on
  // the direction's checksum stream, after the batch's copy if `after_copy`; records
  // batch.summed.
  absl::Status LaunchChecksums(Direction& direction, const Batch& batch, bool after_copy);
  // The head of a store: copies each block from the pinned buffer into its space.
  void CopyIntoPool(const Batch& batch);
  // Room for n checksums in sums[capacity] (call with nothing in flight that writes them).
  static absl::Status ReserveSums(uint64_t*& sums, size_t& capacity, size_t n);
  // The network path for keys[owners[k]] / block_ids[owners[k]], through the pinned buffer.
  void StoreRemote(absl::Span<const std::string> keys, absl::Span<const int32_t> block_ids,
                   absl::Span<const size_t> owners, std::vector<absl::Status>& results)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(store_.mu);
  void LoadRemote(absl::Span<const std::string> keys, absl::Span<const int32_t> block_ids,
                  absl::Span<const size_t> owners, std::vector<absl::Status>& results)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(load_.mu);

  Client& client_;
  const bool force_remote_;
  const bool gpu_checksums_;
  const size_t first_batch_;
  const size_t batch_;
  const size_t last_batch_;  // 0: no limit
  const size_t staged_first_batch_;  // 0: none
  int device_ = 0;  // the device current at Create; made current on every calling thread
  std::vector<kernels::KvSegment> segments_;
  // Groups of layers as runs of segments_: (first segment, count); each layer's group; and the
  // event of each group's copy.
  std::vector<std::pair<int, int>> layers_;
  std::vector<int> group_of_layer_;
  std::vector<cudaEvent_t> layer_events_;
  cudaEvent_t layerwise_done_ = nullptr;
  double layerwise_tail_ = 0.5;
  uint64_t layerwise_tail_max_bytes_ = 0;
  bool layerwise_busy_ ABSL_GUARDED_BY(load_.mu) = false;
  uint64_t* layerwise_sums_ ABSL_GUARDED_BY(load_.mu) = nullptr;
  size_t layerwise_sums_capacity_ ABSL_GUARDED_BY(load_.mu) = 0;
  uint64_t bytes_per_block_ = 0;
  absl::Mutex located_mu_;
  absl::flat_hash_map<std::string, KeptLocation> located_ ABSL_GUARDED_BY(located_mu_);
  Direction store_;
  Direction load_;
  absl::Mutex pools_mu_;
  absl::flat_hash_set<uint8_t*> registered_ ABSL_GUARDED_BY(pools_mu_);
  // The pools this mover registered itself (so only these are unregistered at the end).
  std::vector<uint8_t*> owned_registrations_ ABSL_GUARDED_BY(pools_mu_);
  // Last: its threads are joined first, while everything their tasks touch still exists.
  TaskPool round_trips_;
};

}  // namespace kvpool::engine
