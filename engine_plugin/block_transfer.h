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
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace kvpool::engine {

class BlockTransfer {
 public:
  virtual ~BlockTransfer() = default;

  // Stores block block_ids[i] under keys[i].
  virtual std::vector<absl::Status> StoreBlocks(absl::Span<const std::string> keys,
                                                absl::Span<const int32_t> block_ids) = 0;
  // Loads keys[i] into block block_ids[i].
  virtual std::vector<absl::Status> LoadBlocks(absl::Span<const std::string> keys,
                                               absl::Span<const int32_t> block_ids) = 0;
};

}  // namespace kvpool::engine
