#pragma once

// Where an engine's KV cache blocks live in memory, detected from the strides of its cache
// tensors alone (no knowledge of the attention backend).
//
// Rules, per tensor (see docs/engine_plugin.md for worked examples):
//   page        = storage_bytes / num_blocks        (the storage must divide evenly)
//   outer dims  = dimensions of size > 1 whose byte stride exceeds the page
//   no outer dim  -> one segment:  base = data_ptr,            block_bytes = page
//                    (FlashInfer (num_blocks, 2, ...), MLA (num_blocks, block_size, 576),
//                     K/V packed in the last dimension, one cross-layer tensor)
//   one outer dim -> one segment per index i of it (FlashAttention's K/V `2` of
//                    (2, num_blocks, ...)): base = data_ptr + i * stride,
//                    block_bytes = stride / num_blocks
// Block `b` of a segment is the `block_bytes` bytes at base + b * block_bytes. A tensor is
// accepted only if that addressing is right: some dimension of size num_blocks has a byte
// stride of exactly block_bytes, and every segment lies inside the tensor's storage.
// Storages shared by several tensors are listed once in `regions`.
//
// A KvCacheLayout is an immutable value; share it freely between threads.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace kvpool::engine {

// One KV cache tensor, as the engine's framework describes it. Pointers are plain addresses
// (host or device); nothing here dereferences them.
struct TensorDesc {
  uint64_t data_ptr = 0;       // address of the tensor's first element
  uint64_t storage_ptr = 0;    // start of the allocation the tensor views
  uint64_t storage_bytes = 0;  // size of that allocation
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;  // in elements, one per dimension
  uint32_t element_size = 0;     // bytes per element
  std::string name;              // for messages only ("model.layers.3.attn")
};

// A run of equally sized blocks: block b is [base + b * block_bytes, + block_bytes).
struct KvSegment {
  uint64_t base = 0;
  uint64_t block_bytes = 0;
};

// A distinct allocation to register with the store once.
struct MemoryRegion {
  uint64_t base = 0;
  uint64_t bytes = 0;
};

class KvCacheLayout {
 public:
  // Detects the layout of `tensors` (one per layer, or a single cross-layer tensor), each
  // holding `num_blocks` blocks of `block_size_tokens` tokens. InvalidArgument, naming the
  // tensor and the reason, when a tensor's storage does not divide into num_blocks pages,
  // more than one dimension strides past a page, no dimension of size num_blocks steps by
  // exactly one block, a segment would leave the storage, a block length is not a multiple
  // of block_size_tokens, or one storage is described with two different sizes.
  static absl::StatusOr<KvCacheLayout> Detect(absl::Span<const TensorDesc> tensors,
                                              uint64_t num_blocks, uint32_t block_size_tokens);

  // Builds a layout from known segments (tests, engines that compute their own). Same
  // block-size check as Detect; regions are left empty.
  static absl::StatusOr<KvCacheLayout> FromSegments(std::vector<KvSegment> segments,
                                                    uint64_t num_blocks,
                                                    uint32_t block_size_tokens);

  uint64_t num_blocks() const { return num_blocks_; }
  uint32_t block_size_tokens() const { return block_size_tokens_; }
  // In tensor order; the segments of one tensor in the order of its outer dimension.
  const std::vector<KvSegment>& segments() const { return segments_; }
  // For each segment, the index of the tensor it came from (one tensor per layer: its layer;
  // a cross-layer tensor: 0 for all). FromSegments: each segment its own.
  const std::vector<int>& segment_tensors() const { return segment_tensors_; }
  // Distinct storages, in the order first seen.
  const std::vector<MemoryRegion>& regions() const { return regions_; }
  // Bytes of one full block over every segment: the size of one chunk's value in the pool.
  uint64_t bytes_per_block() const;

  std::string DebugString() const;

 private:
  KvCacheLayout() = default;

  uint64_t num_blocks_ = 0;
  uint32_t block_size_tokens_ = 0;
  std::vector<KvSegment> segments_;
  std::vector<int> segment_tensors_;
  std::vector<MemoryRegion> regions_;
};

}  // namespace kvpool::engine
