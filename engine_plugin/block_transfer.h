#pragma once

// How a worker moves whole blocks between a KV cache it cannot hand to the store as plain
// host buffers (a GPU cache) and the pool: one object per block, under the key the caller
// gives, whose value is the block's bytes in every segment of the layout, in layout order
// (the same bytes a host cache's chunk puts, so pools are shared between the two).
// GpuBlockMover (gpu_block_mover.h) implements it with the CUDA copy kernels; tests implement
// it over host memory. KvSender and KvReceiver use it, when one is given, in place of the
// store's BatchPut and BatchGet.
//
// A chunk shorter than a block (a partial last block, stored only when the engine keeps partial
// chunks) still moves as the whole block: its object is one block long, and a host cache's
// shorter object of the same key fails a load here with InvalidArgument (recomputed).
//
// Implementations must let one thread store while another loads (the sending and receiving
// threads); calls of the same direction come from one thread at a time.
//
// Per-key statuses:
//   StoreBlocks: OK (stored, or already in the pool), ResourceExhausted (NO_AVAILABLE_HANDLE:
//                the pool is under pressure), or a transfer failure.
//   LoadBlocks:  OK (the block holds the object's bytes), NotFound, DataLoss (the bytes do not
//                match the writer's checksum: the block must be recomputed), Aborted (the copy
//                outlasted its lease), InvalidArgument (the object is not one block long), or a
//                transfer failure. A block whose key failed holds unspecified bytes.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace kvpool::engine {

// A load queued layer by layer (layer 0 of every block, then layer 1, ...), so that an engine
// computes layer i while later layers still arrive: vLLM's start_load_kv / wait_for_layer_load.
// Layers are the registered tensors in order (one per layer); a cross-layer cache is one layer,
// and waiting for a layer past the last waits for the last.
// Not thread-safe: one engine thread starts, waits and finishes it.
class LayerwiseLoad {
 public:
  virtual ~LayerwiseLoad() = default;
  virtual int num_layers() const = 0;
  // Makes `stream` (a cudaStream_t, as an integer; 0 for transfers without a GPU) wait until
  // layer `layer` of every block has landed, without blocking this thread; also while `stream`
  // is being captured into a CUDA graph (the graph then waits at each replay for the load
  // started before it). InvalidArgument for a layer out of range.
  virtual absl::Status WaitForLayer(int layer, uintptr_t stream) = 0;
  // Waits for the whole load; per-key statuses as LoadBlocks'. A block's checksum is checked
  // once all its layers landed: what an engine computed from a block that fails here must be
  // thrown away (the block recomputed), as with any failed load. Call once.
  virtual std::vector<absl::Status> Finish() = 0;
};

class BlockTransfer {
 public:
  virtual ~BlockTransfer() = default;

  // Stores block block_ids[i] under keys[i].
  virtual std::vector<absl::Status> StoreBlocks(absl::Span<const std::string> keys,
                                                absl::Span<const int32_t> block_ids) = 0;
  // Loads keys[i] into block block_ids[i].
  virtual std::vector<absl::Status> LoadBlocks(absl::Span<const std::string> keys,
                                               absl::Span<const int32_t> block_ids) = 0;
  // Starts loading keys[i] into block block_ids[i] layer by layer. The default loads all of it
  // now (LoadBlocks) and returns a load whose layers have all landed.
  virtual std::unique_ptr<LayerwiseLoad> StartLayerwiseLoad(absl::Span<const std::string> keys,
                                                            absl::Span<const int32_t> block_ids);
  // The lookup of keys this transfer may load next (StoreWorker::Lookup, the scheduler's
  // prefix query): per key whether the pool holds it. A transfer may keep the leased
  // locations it learns for the next load of those keys, which then skips that round trip to
  // the master; never past their lease. nullopt (the default): no such path, the caller asks
  // the store whether the keys exist.
  virtual std::optional<std::vector<bool>> Locate(absl::Span<const std::string> keys) {
    return std::nullopt;
  }
  // Makes `stream` wait until layer `layer` of the latest layer-wise load has landed (as
  // LayerwiseLoad::WaitForLayer; nothing to wait for before the first). A layer past the
  // transfer's last waits for its last (a cross-layer cache is one layer). The default (loads
  // that complete when started) waits for nothing. InvalidArgument for a negative layer.
  virtual absl::Status WaitForLayer(int layer, uintptr_t stream) {
    return layer < 0 ? absl::InvalidArgumentError("negative layer") : absl::OkStatus();
  }
};

// A load that is already complete (BlockTransfer's default StartLayerwiseLoad).
class FinishedLoad : public LayerwiseLoad {
 public:
  explicit FinishedLoad(std::vector<absl::Status> results) : results_(std::move(results)) {}
  int num_layers() const override { return 1; }
  absl::Status WaitForLayer(int layer, uintptr_t stream) override;
  std::vector<absl::Status> Finish() override { return std::move(results_); }

 private:
  std::vector<absl::Status> results_;
};

inline absl::Status FinishedLoad::WaitForLayer(int layer, uintptr_t) {
  return layer < 0 ? absl::InvalidArgumentError("negative layer") : absl::OkStatus();
}

inline std::unique_ptr<LayerwiseLoad> BlockTransfer::StartLayerwiseLoad(
    absl::Span<const std::string> keys, absl::Span<const int32_t> block_ids) {
  return std::make_unique<FinishedLoad>(LoadBlocks(keys, block_ids));
}

}  // namespace kvpool::engine
