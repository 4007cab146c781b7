#pragma once

// The store's object checksum (XXH3-64 of the object's bytes, proto/checksum.h) computed on the
// GPU, over a paged KV cache's blocks where they lie in GPU memory: a store hashes the blocks it
// gathers and a load the blocks it has just scattered, so no extra pass over host memory is
// made. Bit-identical to XXH3_64bits (libxxhash) for every length (kernels/xxh3.h).
//
// One thread block per object: its 256 threads sum the stripes of 16 KiB of the object at once
// and eight of them carry the accumulator lanes through XXH3's per-KiB scramble in order, so
// many objects hash at once (one per SM or more) and one object still hashes at several hundred
// GB/s from GPU memory.

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/types.h"

namespace kvpool::kernels {

// For each i < num_blocks, the XXH3-64 of block block_ids[i]'s object as CopyBlocks lays it out
// in host memory: segments[s].block_bytes bytes from
//   segments[s].base + block_ids[i] * segments[s].block_stride       (GPU memory)
// at object offset segments[s].host_offset, for every segment. The segments must tile the
// object: host_offset of segment s + 1 == host_offset + block_bytes of segment s, starting at 0
// (cudaErrorInvalidValue otherwise, nothing launched). `checksums` [num_blocks] is device memory
// or host memory the device can write (cudaHostAlloc, cudaHostRegister); it is written in stream
// order. The arrays are read before the call returns. Any number of blocks; at most
// kMaxChecksumSegments segments (cudaErrorInvalidValue beyond).
inline constexpr int kMaxChecksumSegments = 256;
cudaError_t ChecksumBlocks(const KvSegment* segments, int num_segments,  // [num_segments]
                           const int32_t* block_ids,                     // [num_blocks]
                           int num_blocks, uint64_t* checksums,          // [num_blocks]
                           cudaStream_t stream);

// The XXH3-64 of `bytes` bytes of device memory at `data` (any alignment), into *checksum.
cudaError_t ChecksumBuffer(const void* data, uint64_t bytes, uint64_t* checksum,
                           cudaStream_t stream);

}  // namespace kvpool::kernels
