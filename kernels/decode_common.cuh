#pragma once

// Split-K ("flash decoding") plumbing shared by the GQA and MLA decode kernels: the workspace
// layout, the choice of the split size, and the kernel that merges partial results. Internal.

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "kernels/cuda_common.cuh"

namespace kvpool::kernels::detail {

// Workspace: [work counter, 256 B][partial lse: batch * max_splits * heads floats]
//            [partial o: batch * max_splits * heads * dim floats]
// A partial is written only for sequences split into more than one chunk.
struct SplitWorkspace {
  int* counter = nullptr;
  float* part_lse = nullptr;  // [batch, max_splits, heads], natural log
  float* part_o = nullptr;    // [batch, max_splits, heads, dim], already divided by its sum
};

constexpr size_t kCounterBytes = 256;

inline size_t SplitWorkspaceBytes(int batch, int max_splits, int heads, int dim) {
  if (max_splits <= 1) return kCounterBytes;
  return kCounterBytes + size_t{4} * batch * max_splits * heads * (size_t{1} + dim);
}

inline SplitWorkspace CarveSplitWorkspace(void* base, int batch, int max_splits, int heads) {
  SplitWorkspace w;
  auto* p = static_cast<uint8_t*>(base);
  w.counter = reinterpret_cast<int*>(p);
  w.part_lse = reinterpret_cast<float*>(p + kCounterBytes);
  w.part_o = w.part_lse + size_t{1} * batch * max_splits * heads;
  return w;
}

// Tokens per work item (a multiple of `granule`): about `waves` items per resident CTA over the
// whole request, at least min_chunk, and no more splits per sequence than `max_splits_cap`.
inline int ChooseChunk(int64_t units, int max_seq_len, int resident_ctas, int granule,
                       int min_chunk, int waves, int max_splits_cap) {
  const int64_t target_items = int64_t{resident_ctas} * waves;
  // units = independent (sequence, head group) pairs; each contributes len / chunk items.
  int64_t chunk = (units * max_seq_len + target_items - 1) / std::max<int64_t>(target_items, 1);
  chunk = std::max<int64_t>(chunk, min_chunk);
  if (max_splits_cap >= 1) {
    chunk = std::max<int64_t>(chunk, (max_seq_len + max_splits_cap - 1) / max_splits_cap);
  }
  chunk = (chunk + granule - 1) / granule * granule;
  const int64_t whole = (int64_t{max_seq_len} + granule - 1) / granule * granule;
  chunk = std::min(chunk, std::max<int64_t>(whole, granule));
  return static_cast<int>(chunk);
}

inline int NumSplits(int max_seq_len, int chunk) {
  return std::max(1, (max_seq_len + chunk - 1) / chunk);
}

// Merges the partial results of every (sequence, head) that was split: one warp each.
// o: [batch, heads, dim] of OutT (bf16 or fp16 pairs), lse: [batch, heads] or null.
template <bool kOutBf16, int kDim>
__global__ void __launch_bounds__(128)
    MergeSplitsKernel(const float* __restrict__ part_o, const float* __restrict__ part_lse,
                      const int32_t* __restrict__ seq_lens, int batch, int heads, int max_splits,
                      int chunk, void* __restrict__ o, float* __restrict__ lse) {
  const int warp = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (warp >= batch * heads) return;
  const int b = warp / heads;
  const int h = warp % heads;
  const int n = (seq_lens[b] + chunk - 1) / chunk;
  if (n <= 1) return;  // written directly by the attention kernel
  const float* pl = part_lse + size_t{1} * b * max_splits * heads + h;
  float m = -INFINITY;
  for (int s = lane; s < n; s += 32) m = fmaxf(m, pl[size_t{1} * s * heads]);
#pragma unroll
  for (int off = 16; off > 0; off /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
  constexpr int kPer = kDim / 32;  // values per lane, consecutive pairs
  float acc[kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i) acc[i] = 0.0f;
  float sum = 0.0f;
  for (int s = 0; s < n; ++s) {
    const float w = __expf(pl[size_t{1} * s * heads] - m);
    sum += w;
    const float* po = part_o + ((size_t{1} * b * max_splits + s) * heads + h) * kDim;
#pragma unroll
    for (int i = 0; i < kPer; i += 2) {
      const float2 v = *reinterpret_cast<const float2*>(po + i * 32 + lane * 2);
      acc[i] += w * v.x;
      acc[i + 1] += w * v.y;
    }
  }
  const float inv = 1.0f / sum;
  uint32_t* out = static_cast<uint32_t*>(o) + (size_t{1} * b * heads + h) * (kDim / 2);
#pragma unroll
  for (int i = 0; i < kPer; i += 2) {
    out[(i * 32 + lane * 2) / 2] = PackFloat2<kOutBf16>(acc[i] * inv, acc[i + 1] * inv);
  }
  if (lse != nullptr && lane == 0) lse[size_t{1} * b * heads + h] = m + __logf(sum);
}

template <bool kOutBf16, int kDim>
cudaError_t LaunchMergeSplits(const SplitWorkspace& ws, const int32_t* seq_lens, int batch,
                              int heads, int max_splits, int chunk, void* o, float* lse,
                              cudaStream_t stream) {
  const int warps = batch * heads;
  const int grid = (warps + 3) / 4;
  MergeSplitsKernel<kOutBf16, kDim><<<grid, 128, 0, stream>>>(
      ws.part_o, ws.part_lse, seq_lens, batch, heads, max_splits, chunk, o, lse);
  return cudaGetLastError();
}

inline int NumSms() {
  int device = 0, sms = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
    return 0;
  }
  return sms;
}

}  // namespace kvpool::kernels::detail
