#pragma once

// Block gather/scatter between a paged KV cache in GPU memory and block objects in host memory
// the GPU can address (cudaHostAlloc'ed staging buffers, or a same-host segment's shared-memory
// pool registered with cudaHostRegister), so a store or a load is a single copy.
//
// The host memory must be addressable at its host address from the device: true for
// cudaHostAlloc and for cudaHostRegister on 64-bit Linux (device attribute
// cudaDevAttrCanUseHostPointerForRegisteredMem = 1, as on every x86-64 and Grace system).

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/types.h"

namespace kvpool::kernels {

// Device memory for CopyMethod::kStaged: room for at least one block object (the span of the
// segments' host ranges); more lets fewer, larger steps run. One per stream in flight.
struct CopyStaging {
  void* device = nullptr;
  size_t bytes = 0;
};

// For each i < num_blocks and each segment s, copies segments[s].block_bytes bytes between
//   segments[s].base + block_ids[i] * segments[s].block_stride      (GPU cache)
//   host_blocks[i] + segments[s].host_offset                         (host object)
// in `direction`, bit-exact, as CpuCopyBlocks does. The three arrays are ordinary host memory
// and are read before the call returns (they may be reused at once); the bytes move on `stream`
// in stream order, and any number of blocks and segments is fine (large requests become a few
// launches). kCopyEngine and kStaged need a stream other than the legacy default stream;
// kStaged needs `staging` (otherwise it falls back to kKernel). Host bytes outside the
// segments' ranges are never written. Returns the first CUDA error met; the request is then
// partly done.
cudaError_t CopyBlocks(const KvSegment* segments, int num_segments,  // [num_segments]
                       const int32_t* block_ids,                     // [num_blocks]
                       uint8_t* const* host_blocks,                  // [num_blocks]
                       int num_blocks, CopyDirection direction, CopyMethod method,
                       const CopyStaging& staging, cudaStream_t stream);

// What kAuto does: kStaged when a staging buffer is given and a block object spans at least
// kAutoStagedMinObjectBytes (the copy engines reach full PCIe speed only on large copies, and
// only they run both directions at full speed at once), otherwise kKernel. Measured on an H200;
// see docs/benchmarks.md.
inline constexpr uint64_t kAutoStagedMinObjectBytes = uint64_t{256} << 10;
CopyMethod AutoCopyMethod(uint64_t object_span_bytes, bool have_staging);

}  // namespace kvpool::kernels
