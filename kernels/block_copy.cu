#include "kernels/block_copy.cuh"

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

namespace kvpool::kernels {
namespace {

// The request travels in the kernel's parameters (up to 32 KiB on Volta and later with CUDA
// 12.1+), so no metadata has to be staged in device memory and the caller's arrays can be
// reused as soon as CopyBlocks returns.
struct SegmentParam {
  uint64_t base;
  uint64_t block_bytes;
  uint64_t block_stride;
  uint64_t host_offset;
};

template <int kMaxSegments, int kMaxBlocks>
struct CopyParams {
  static constexpr int kMaxSegs = kMaxSegments;
  static constexpr int kMaxBlks = kMaxBlocks;
  uint32_t num_segments;
  uint32_t num_blocks;
  uint32_t chunks_per_block;  // chunks of kChunkBytes in the largest segment block
  uint32_t to_host;           // 1: device -> host
  SegmentParam seg[kMaxSegments];
  uint64_t host[kMaxBlocks];
  int32_t block_ids[kMaxBlocks];
};

using SmallParams = CopyParams<64, 128>;
using LargeParams = CopyParams<256, 1792>;
static_assert(sizeof(SmallParams) < 4096, "fits the classic 4 KiB parameter limit");
static_assert(sizeof(LargeParams) <= 32764, "kernel parameters are limited to 32764 bytes");

constexpr int kCopyThreads = 256;
constexpr int kCopyUnroll = 4;  // 16-byte loads in flight per thread before the stores
constexpr uint32_t kChunkBytes = kCopyThreads * kCopyUnroll * 16;  // 16 KiB per work unit

// Plain (coherent) 16-byte global accesses: either end may be mapped host memory, so no
// read-only (.nc) path.
__device__ __forceinline__ uint4 Load16(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.v4.u32 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}
__device__ __forceinline__ void Store16(uint4* p, const uint4& v) {
  asm volatile("st.global.v4.u32 [%0], {%1,%2,%3,%4};\n" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z),
               "r"(v.w)
               : "memory");
}

// Copies [0, bytes) from src to dst with this thread block; both 16-byte aligned, bytes a
// multiple of 16. Each thread loads kCopyUnroll vectors before storing any, so that many
// PCIe reads are in flight (the host side may be either end).
__device__ __forceinline__ void CopyChunk16(uint8_t* __restrict__ dst,
                                            const uint8_t* __restrict__ src, uint32_t bytes) {
  const uint32_t n = bytes / 16;
  const uint4* s = reinterpret_cast<const uint4*>(src);
  uint4* d = reinterpret_cast<uint4*>(dst);
  for (uint32_t base = 0; base < n; base += kCopyThreads * kCopyUnroll) {
    uint4 v[kCopyUnroll];
#pragma unroll
    for (int u = 0; u < kCopyUnroll; ++u) {
      const uint32_t i = base + u * kCopyThreads + threadIdx.x;
      if (i < n) v[u] = Load16(s + i);
    }
#pragma unroll
    for (int u = 0; u < kCopyUnroll; ++u) {
      const uint32_t i = base + u * kCopyThreads + threadIdx.x;
      if (i < n) Store16(d + i, v[u]);
    }
  }
}

__device__ __forceinline__ void CopyChunkBytes(uint8_t* __restrict__ dst,
                                               const uint8_t* __restrict__ src, uint32_t bytes) {
  for (uint32_t i = threadIdx.x; i < bytes; i += kCopyThreads) dst[i] = src[i];
}

// Work unit u = (block i, segment s, chunk c); a grid-stride loop over all units.
template <typename Params>
__global__ void __launch_bounds__(kCopyThreads) CopyBlocksKernel(const __grid_constant__ Params p) {
  const uint64_t units = uint64_t{p.num_blocks} * p.num_segments * p.chunks_per_block;
  for (uint64_t u = blockIdx.x; u < units; u += gridDim.x) {
    const uint32_t c = static_cast<uint32_t>(u % p.chunks_per_block);
    const uint64_t pair = u / p.chunks_per_block;
    const uint32_t s = static_cast<uint32_t>(pair % p.num_segments);
    const uint32_t i = static_cast<uint32_t>(pair / p.num_segments);
    const SegmentParam& seg = p.seg[s];
    const uint64_t begin = uint64_t{c} * kChunkBytes;
    if (begin >= seg.block_bytes) continue;
    const uint32_t bytes =
        static_cast<uint32_t>(min(seg.block_bytes - begin, uint64_t{kChunkBytes}));
    uint8_t* dev = reinterpret_cast<uint8_t*>(
        seg.base + uint64_t(int64_t{p.block_ids[i]}) * seg.block_stride + begin);
    uint8_t* host = reinterpret_cast<uint8_t*>(p.host[i] + seg.host_offset + begin);
    uint8_t* dst = p.to_host ? host : dev;
    const uint8_t* src = p.to_host ? dev : host;
    if (((reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src) | bytes) & 15) == 0) {
      CopyChunk16(dst, src, bytes);
    } else {
      CopyChunkBytes(dst, src, bytes);
    }
  }
}

int NumSms() {
  int device = 0, sms = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return 132;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
    return 132;
  }
  return sms;
}

template <typename Params>
cudaError_t LaunchCopyKernel(const KvSegment* segments, int num_segments, const int32_t* block_ids,
                             uint8_t* const* host_blocks, int num_blocks, CopyDirection direction,
                             cudaStream_t stream) {
  Params p;
  p.to_host = direction == CopyDirection::kDeviceToHost ? 1 : 0;
  for (int s0 = 0; s0 < num_segments; s0 += Params::kMaxSegs) {
    const int ns = std::min(Params::kMaxSegs, num_segments - s0);
    uint64_t max_bytes = 0;
    for (int s = 0; s < ns; ++s) {
      const KvSegment& in = segments[s0 + s];
      p.seg[s] = {in.base, in.block_bytes, in.block_stride, in.host_offset};
      max_bytes = std::max(max_bytes, in.block_bytes);
    }
    if (max_bytes == 0) continue;
    p.num_segments = static_cast<uint32_t>(ns);
    p.chunks_per_block = static_cast<uint32_t>((max_bytes + kChunkBytes - 1) / kChunkBytes);
    for (int b0 = 0; b0 < num_blocks; b0 += Params::kMaxBlks) {
      const int nb = std::min(Params::kMaxBlks, num_blocks - b0);
      for (int i = 0; i < nb; ++i) {
        p.block_ids[i] = block_ids[b0 + i];
        p.host[i] = reinterpret_cast<uint64_t>(host_blocks[b0 + i]);
      }
      p.num_blocks = static_cast<uint32_t>(nb);
      const uint64_t units = uint64_t{p.num_blocks} * p.num_segments * p.chunks_per_block;
      // Half the machine's threads (1024 per SM): a load and a store running at once on two
      // streams then share the GPU instead of queueing behind each other.
      const int grid = static_cast<int>(std::min<uint64_t>(units, uint64_t{4} * NumSms()));
      CopyBlocksKernel<Params><<<grid, kCopyThreads, 0, stream>>>(p);
      if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
    }
  }
  return cudaSuccess;
}

cudaError_t CopyWithKernel(const KvSegment* segments, int num_segments, const int32_t* block_ids,
                           uint8_t* const* host_blocks, int num_blocks, CopyDirection direction,
                           cudaStream_t stream) {
  if (num_segments <= SmallParams::kMaxSegs && num_blocks <= SmallParams::kMaxBlks) {
    return LaunchCopyKernel<SmallParams>(segments, num_segments, block_ids, host_blocks, num_blocks,
                                         direction, stream);
  }
  return LaunchCopyKernel<LargeParams>(segments, num_segments, block_ids, host_blocks, num_blocks,
                                       direction, stream);
}

// Per-thread scratch for the copy-engine paths, reused across calls.
struct CopyList {
  std::vector<void*> dst;
  std::vector<const void*> src;
  std::vector<size_t> size;
  void Clear() {
    dst.clear();
    src.clear();
    size.clear();
  }
  // Appends a copy, merged with the previous one when both ends continue it.
  void Add(void* d, const void* s, size_t n) {
    if (!size.empty() && static_cast<const uint8_t*>(src.back()) + size.back() == s &&
        static_cast<uint8_t*>(dst.back()) + size.back() == d) {
      size.back() += n;
      return;
    }
    dst.push_back(d);
    src.push_back(s);
    size.push_back(n);
  }
};

// One cudaMemcpyBatchAsync for the whole list (one cudaMemcpyAsync each where batches are not
// available, e.g. on the legacy default stream).
cudaError_t SubmitCopies(CopyList& list, cudaMemcpyKind kind, cudaStream_t stream) {
  if (list.size.empty()) return cudaSuccess;
  if (stream != nullptr && stream != cudaStreamLegacy) {
    cudaMemcpyAttributes attr = {};
    attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    size_t attr_index = 0;
    const cudaError_t e = cudaMemcpyBatchAsync(list.dst.data(), list.src.data(), list.size.data(),
                                               list.size.size(), &attr, &attr_index, 1, stream);
    if (e == cudaSuccess) return e;
    if (e != cudaErrorNotSupported && e != cudaErrorInvalidValue) return e;
    (void)cudaGetLastError();  // not a sticky error: fall back to one copy per range
  }
  for (size_t j = 0; j < list.size.size(); ++j) {
    const cudaError_t e = cudaMemcpyAsync(list.dst[j], list.src[j], list.size[j], kind, stream);
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

cudaError_t CopyWithEngines(const KvSegment* segments, int num_segments, const int32_t* block_ids,
                            uint8_t* const* host_blocks, int num_blocks, CopyDirection direction,
                            cudaStream_t stream) {
  thread_local CopyList list;
  list.Clear();
  const bool to_host = direction == CopyDirection::kDeviceToHost;
  for (int i = 0; i < num_blocks; ++i) {
    for (int s = 0; s < num_segments; ++s) {
      const KvSegment& seg = segments[s];
      if (seg.block_bytes == 0) continue;
      auto* dev =
          reinterpret_cast<uint8_t*>(seg.base + uint64_t(int64_t{block_ids[i]}) * seg.block_stride);
      uint8_t* host = host_blocks[i] + seg.host_offset;
      if (to_host) {
        list.Add(host, dev, seg.block_bytes);
      } else {
        list.Add(dev, host, seg.block_bytes);
      }
    }
  }
  return SubmitCopies(list, to_host ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice, stream);
}

// The segments' host ranges: their span [lo, hi) and the contiguous runs inside it.
struct HostLayout {
  uint64_t lo = 0;
  uint64_t hi = 0;
  std::vector<std::pair<uint64_t, uint64_t>> runs;  // (offset, bytes), sorted
};

void ComputeHostLayout(const KvSegment* segments, int num_segments, HostLayout* out) {
  out->runs.clear();
  for (int s = 0; s < num_segments; ++s) {
    if (segments[s].block_bytes > 0) {
      out->runs.emplace_back(segments[s].host_offset, segments[s].block_bytes);
    }
  }
  std::sort(out->runs.begin(), out->runs.end());
  size_t n = 0;
  for (size_t j = 0; j < out->runs.size(); ++j) {
    if (n > 0 && out->runs[n - 1].first + out->runs[n - 1].second >= out->runs[j].first) {
      const uint64_t end = std::max(out->runs[n - 1].first + out->runs[n - 1].second,
                                    out->runs[j].first + out->runs[j].second);
      out->runs[n - 1].second = end - out->runs[n - 1].first;
    } else {
      out->runs[n++] = out->runs[j];
    }
  }
  out->runs.resize(n);
  out->lo = n ? out->runs.front().first : 0;
  out->hi = n ? out->runs.back().first + out->runs.back().second : 0;
}

// kStaged: each block object is assembled (or taken apart) in device memory by the copy
// kernel, at HBM speed, and crosses PCIe as one large copy-engine transfer per contiguous run
// of its host range (one per block in the usual packed layout).
cudaError_t CopyStaged(const KvSegment* segments, int num_segments, const int32_t* block_ids,
                       uint8_t* const* host_blocks, int num_blocks, CopyDirection direction,
                       const CopyStaging& staging, cudaStream_t stream) {
  thread_local HostLayout layout;
  thread_local std::vector<KvSegment> rebased;
  thread_local std::vector<uint8_t*> images;
  thread_local CopyList list;
  ComputeHostLayout(segments, num_segments, &layout);
  if (layout.runs.empty()) return cudaSuccess;
  const uint64_t stride = (layout.hi - layout.lo + 255) / 256 * 256;
  const uint64_t per_step = staging.device == nullptr ? 0 : staging.bytes / stride;
  if (per_step == 0 || stream == nullptr || stream == cudaStreamLegacy) {
    return CopyWithKernel(segments, num_segments, block_ids, host_blocks, num_blocks, direction,
                          stream);
  }
  rebased.assign(segments, segments + num_segments);
  for (KvSegment& seg : rebased) seg.host_offset -= layout.lo;
  auto* base = static_cast<uint8_t*>(staging.device);
  const bool to_host = direction == CopyDirection::kDeviceToHost;
  for (int b0 = 0; b0 < num_blocks; b0 += static_cast<int>(per_step)) {
    const int n = static_cast<int>(std::min<uint64_t>(per_step, num_blocks - b0));
    images.resize(n);
    list.Clear();
    for (int i = 0; i < n; ++i) {
      images[i] = base + i * stride;
      for (const auto& [off, bytes] : layout.runs) {
        uint8_t* host = host_blocks[b0 + i] + off;
        uint8_t* image = images[i] + (off - layout.lo);
        if (to_host) {
          list.Add(host, image, bytes);
        } else {
          list.Add(image, host, bytes);
        }
      }
    }
    if (to_host) {
      if (cudaError_t e = CopyWithKernel(rebased.data(), num_segments, block_ids + b0,
                                         images.data(), n, direction, stream);
          e != cudaSuccess) {
        return e;
      }
      if (cudaError_t e = SubmitCopies(list, cudaMemcpyDeviceToHost, stream); e != cudaSuccess) {
        return e;
      }
    } else {
      if (cudaError_t e = SubmitCopies(list, cudaMemcpyHostToDevice, stream); e != cudaSuccess) {
        return e;
      }
      if (cudaError_t e = CopyWithKernel(rebased.data(), num_segments, block_ids + b0,
                                         images.data(), n, direction, stream);
          e != cudaSuccess) {
        return e;
      }
    }
  }
  return cudaSuccess;
}

}  // namespace

CopyMethod AutoCopyMethod(uint64_t object_span_bytes, bool have_staging) {
  return have_staging && object_span_bytes >= kAutoStagedMinObjectBytes ? CopyMethod::kStaged
                                                                        : CopyMethod::kKernel;
}

cudaError_t CopyBlocks(const KvSegment* segments, int num_segments, const int32_t* block_ids,
                       uint8_t* const* host_blocks, int num_blocks, CopyDirection direction,
                       CopyMethod method, const CopyStaging& staging, cudaStream_t stream) {
  if (num_segments <= 0 || num_blocks <= 0) return cudaSuccess;
  if (method == CopyMethod::kAuto) {
    uint64_t lo = UINT64_MAX, hi = 0;
    for (int s = 0; s < num_segments; ++s) {
      if (segments[s].block_bytes == 0) continue;
      lo = std::min(lo, segments[s].host_offset);
      hi = std::max(hi, segments[s].host_offset + segments[s].block_bytes);
    }
    method = AutoCopyMethod(hi > lo ? hi - lo : 0, staging.device != nullptr);
  }
  switch (method) {
    case CopyMethod::kKernel:
    case CopyMethod::kAuto:
      return CopyWithKernel(segments, num_segments, block_ids, host_blocks, num_blocks, direction,
                            stream);
    case CopyMethod::kCopyEngine:
      return CopyWithEngines(segments, num_segments, block_ids, host_blocks, num_blocks, direction,
                             stream);
    case CopyMethod::kStaged:
      return CopyStaged(segments, num_segments, block_ids, host_blocks, num_blocks, direction,
                        staging, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace kvpool::kernels
