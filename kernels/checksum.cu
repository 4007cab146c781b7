#include "kernels/checksum.cuh"

#include <algorithm>

#include "kernels/xxh3.h"

namespace kvpool::kernels {
namespace {

namespace x = xxh3;

// The request travels in the kernel's parameters, as CopyBlocks' does (block_copy.cu).
struct SegmentParam {
  uint64_t base;
  uint64_t stride;
  uint64_t begin;  // object offset of the segment's first byte
  uint64_t end;    // one past its last
};

constexpr int kMaxBlocksPerLaunch = 1024;
struct ChecksumParams {
  uint64_t object_bytes;
  uint64_t* out;
  uint32_t num_segments;
  uint32_t num_blocks;
  SegmentParam seg[kMaxChecksumSegments];
  int32_t block_ids[kMaxBlocksPerLaunch];
};
static_assert(sizeof(ChecksumParams) <= 32764, "kernel parameters are limited to 32764 bytes");

constexpr int kThreads = 256;
constexpr int kGroups = kThreads / x::kStripesPerBlock;  // KiB blocks summed per step

__constant__ x::Secret kSecretOnDevice = x::kDefaultSecret;

struct Object {
  const SegmentParam* seg;  // in shared memory
  uint32_t num_segments;
  int64_t id;

  // The segment holding object offset o (o < object bytes).
  __device__ __forceinline__ uint32_t SegmentOf(uint64_t o) const {
    uint32_t lo = 0, hi = num_segments - 1;
    while (lo < hi) {
      const uint32_t mid = (lo + hi + 1) / 2;
      if (seg[mid].begin <= o) {
        lo = mid;
      } else {
        hi = mid - 1;
      }
    }
    return lo;
  }
  __device__ __forceinline__ const uint8_t* Address(uint32_t s, uint64_t o) const {
    return reinterpret_cast<const uint8_t*>(seg[s].base + uint64_t(id) * seg[s].stride +
                                            (o - seg[s].begin));
  }
  __device__ __forceinline__ uint8_t Byte(uint64_t o) const { return *Address(SegmentOf(o), o); }

  // The 8 little-endian words of the 64 bytes at object offset o.
  __device__ __forceinline__ void Stripe(uint64_t o, uint64_t* w) const {
    const uint32_t s = SegmentOf(o);
    const uint8_t* p = Address(s, o);
    const uintptr_t a = reinterpret_cast<uintptr_t>(p);
    if (o + x::kStripeBytes <= seg[s].end && (a & 15) == 0) {
      const uint4* v = reinterpret_cast<const uint4*>(p);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const uint4 q = v[k];
        w[2 * k] = uint64_t{q.x} | uint64_t{q.y} << 32;
        w[2 * k + 1] = uint64_t{q.z} | uint64_t{q.w} << 32;
      }
    } else if (o + x::kStripeBytes <= seg[s].end && (a & 7) == 0) {
      const uint64_t* v = reinterpret_cast<const uint64_t*>(p);
#pragma unroll
      for (int k = 0; k < 8; ++k) w[k] = v[k];
    } else {  // crosses segments, or unaligned: byte by byte
      for (int k = 0; k < 8; ++k) {
        uint64_t word = 0;
        for (int b = 0; b < 8; ++b) word |= uint64_t{Byte(o + 8 * k + b)} << (8 * b);
        w[k] = word;
      }
    }
  }
};

// Sums of the 16 threads of a group (aligned 16-lane halves of a warp).
__device__ __forceinline__ void ReduceGroup(uint64_t* sums) {
#pragma unroll
  for (int i = 0; i < 8; ++i) {
#pragma unroll
    for (int offset = x::kStripesPerBlock / 2; offset > 0; offset /= 2) {
      sums[i] += __shfl_xor_sync(0xffffffffu, sums[i], offset);
    }
  }
}

__global__ void __launch_bounds__(kThreads)
    ChecksumKernel(const __grid_constant__ ChecksumParams p) {
  __shared__ SegmentParam seg[kMaxChecksumSegments];
  __shared__ uint8_t secret[x::kSecretBytes];
  __shared__ uint64_t words[x::kSecretWords];
  __shared__ uint64_t block_sums[kGroups][8];
  __shared__ uint64_t lanes[8];
  for (uint32_t s = threadIdx.x; s < p.num_segments; s += kThreads) seg[s] = p.seg[s];
  for (int b = threadIdx.x; b < x::kSecretBytes; b += kThreads) {
    secret[b] = kSecretOnDevice.bytes[b];
  }
  __syncthreads();
  for (int w = threadIdx.x; w < x::kSecretWords; w += kThreads) {
    words[w] = x::Read64(secret + 8 * w);
  }
  __syncthreads();

  const Object object{seg, p.num_segments, p.block_ids[blockIdx.x]};
  const uint64_t len = p.object_bytes;
  if (len <= x::kMaxShortBytes) {
    if (threadIdx.x == 0) {
      uint8_t bytes[x::kMaxShortBytes];
      for (uint64_t o = 0; o < len; ++o) bytes[o] = object.Byte(o);
      p.out[blockIdx.x] = x::ShortHash(bytes, len, secret);
    }
    return;
  }

  const int group = threadIdx.x / x::kStripesPerBlock;
  const int stripe = threadIdx.x % x::kStripesPerBlock;
  const x::LongShape shape = x::ShapeOf(len);
  uint64_t acc = threadIdx.x < 8 ? x::InitLane(threadIdx.x) : 0;
  for (uint64_t b0 = 0; b0 < shape.full_blocks; b0 += kGroups) {
    uint64_t sums[8] = {};
    const uint64_t b = b0 + group;
    if (b < shape.full_blocks) {
      uint64_t data[8];
      object.Stripe(b * x::kBlockBytes + stripe * x::kStripeBytes, data);
      x::StripeAdd(data, words + stripe, sums);
    }
    ReduceGroup(sums);
    if (stripe == 0) {
#pragma unroll
      for (int i = 0; i < 8; ++i) block_sums[group][i] = sums[i];
    }
    __syncthreads();
    if (threadIdx.x < 8) {
      const int n = static_cast<int>(min(uint64_t{kGroups}, shape.full_blocks - b0));
      const uint64_t key = words[x::kScrambleSecret / 8 + threadIdx.x];
      for (int k = 0; k < n; ++k) acc = x::Scramble(acc + block_sums[k][threadIdx.x], key);
    }
    __syncthreads();
  }
  // The last partial block (group 0) and the last stripe (thread 16, group 1), unscrambled.
  uint64_t sums[8] = {};
  if (group == 0 && stripe < shape.tail_stripes) {
    uint64_t data[8];
    object.Stripe(shape.full_blocks * x::kBlockBytes + stripe * x::kStripeBytes, data);
    x::StripeAdd(data, words + stripe, sums);
  } else if (threadIdx.x == x::kStripesPerBlock) {
    uint64_t data[8], key[8];
    object.Stripe(len - x::kStripeBytes, data);
    for (int i = 0; i < 8; ++i) key[i] = x::Read64(secret + x::kLastStripeSecret + 8 * i);
    x::StripeAdd(data, key, sums);
  }
  ReduceGroup(sums);
  if (stripe == 0 && group < 2) {
#pragma unroll
    for (int i = 0; i < 8; ++i) block_sums[group][i] = sums[i];
  }
  __syncthreads();
  if (threadIdx.x < 8) {
    lanes[threadIdx.x] = acc + block_sums[0][threadIdx.x] + block_sums[1][threadIdx.x];
  }
  __syncthreads();
  if (threadIdx.x == 0) p.out[blockIdx.x] = x::MergeLanes(lanes, len, secret);
}

}  // namespace

cudaError_t ChecksumBlocks(const KvSegment* segments, int num_segments, const int32_t* block_ids,
                           int num_blocks, uint64_t* checksums, cudaStream_t stream) {
  if (num_segments <= 0 || num_segments > kMaxChecksumSegments || num_blocks < 0 ||
      checksums == nullptr) {
    return cudaErrorInvalidValue;
  }
  ChecksumParams p;
  uint64_t offset = 0;
  for (int s = 0; s < num_segments; ++s) {
    if (segments[s].host_offset != offset) return cudaErrorInvalidValue;
    p.seg[s] = {segments[s].base, segments[s].block_stride, offset,
                offset + segments[s].block_bytes};
    offset += segments[s].block_bytes;
  }
  // Empty segments never hold an offset: drop them so that SegmentOf finds a non-empty one.
  uint32_t kept = 0;
  for (int s = 0; s < num_segments; ++s) {
    if (p.seg[s].end > p.seg[s].begin) p.seg[kept++] = p.seg[s];
  }
  p.object_bytes = offset;
  p.num_segments = kept;
  if (kept == 0) {  // empty objects: point every one at a harmless byte (none is read)
    p.seg[0] = {reinterpret_cast<uint64_t>(checksums), 0, 0, 0};
    p.num_segments = 1;
  }
  for (int b0 = 0; b0 < num_blocks; b0 += kMaxBlocksPerLaunch) {
    const int nb = std::min(kMaxBlocksPerLaunch, num_blocks - b0);
    std::copy(block_ids + b0, block_ids + b0 + nb, p.block_ids);
    p.num_blocks = static_cast<uint32_t>(nb);
    p.out = checksums + b0;
    ChecksumKernel<<<nb, kThreads, 0, stream>>>(p);
    if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

cudaError_t ChecksumBuffer(const void* data, uint64_t bytes, uint64_t* checksum,
                           cudaStream_t stream) {
  const KvSegment segment{reinterpret_cast<uint64_t>(data), bytes, bytes, 0};
  const int32_t block = 0;
  return ChecksumBlocks(&segment, 1, &block, 1, checksum, stream);
}

}  // namespace kvpool::kernels
