#pragma once

// Split-K ("flash decoding") plumbing shared by the GQA and MLA decode kernels: the device view
// of a plan's workspace, its upload, and the kernel that merges partial results. Internal.

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "kernels/cuda_common.cuh"
#include "kernels/decode_plan.h"

namespace kvpool::kernels::detail {

// Device view of the workspace a plan was written into (decode_plan.h's DecodeWorkspaceLayout).
struct PlanWorkspace {
  int* counter = nullptr;  // [0]: the work counter, [1]: blocks done; zero between launches
  const DecodeWorkItem* items = nullptr;    // the plan's items, in the order blocks take them
  const DecodeMergeItem* merges = nullptr;  // split sequences
  float* part_lse = nullptr;                // [slots, heads], natural log
  float* part_o = nullptr;                  // [slots, heads, dim], already divided by its sum
};

inline PlanWorkspace CarvePlanWorkspace(void* base, const DecodeWorkspaceLayout& l) {
  PlanWorkspace w;
  auto* p = static_cast<uint8_t*>(base);
  w.counter = reinterpret_cast<int*>(p);
  w.items = reinterpret_cast<const DecodeWorkItem*>(p + l.items);
  w.merges = reinterpret_cast<const DecodeMergeItem*>(p + l.merges);
  w.part_lse = reinterpret_cast<float*>(p + l.part_lse);
  w.part_o = reinterpret_cast<float*>(p + l.part_o);
  return w;
}

// Programmatic dependent launch (Hopper): the attention kernels let the merge kernel be launched
// while they still run (LaunchDependents, at their start), and the merge kernel, launched with
// the programmatic-serialization attribute, waits for their completion and memory
// (WaitForPrimary: griddepcontrol.wait returns once the preceding grid has finished and its
// writes are visible; without the attribute it returns at once). The merge's launch and
// scheduling overlap the attention kernel's tail instead of following it.
__device__ __forceinline__ void LaunchDependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void WaitForPrimary() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// A producer warp's next work item: lane 0 takes it from the plan's counter, every lane gets it.
__device__ __forceinline__ int WarpTakeItem(int* counter, int lane) {
  int v = 0;
  if (lane == 0) v = atomicAdd(counter, 1);
  return __shfl_sync(0xffffffffu, v, 0);
}

// A producer warp's first and next items: in a chained plan (SplitPlan::Chained) block i takes
// item i, then each item's `next` (-1: done); otherwise items come from the work counter.
__device__ __forceinline__ int WarpFirstItem(int* counter, int chained, int lane) {
  return chained ? static_cast<int>(blockIdx.x) : WarpTakeItem(counter, lane);
}
__device__ __forceinline__ int WarpNextItem(const PlanWorkspace& ws, int chained, int item,
                                            int lane) {
  return chained ? __ldg(&ws.items[item].next) : WarpTakeItem(ws.counter, lane);
}

// The work counter resets itself: each block of a counter launch calls this once, from one
// thread, after its take from counter[0] came back past the last item; the last block to
// arrive sets both words back to zero (no block takes again after its own arrival, and the
// fence orders its last take before it), so the next launch needs no memset. PlanGqaDecode /
// PlanMlaDecode zero both words when they write the plan.
__device__ __forceinline__ void FinishWorkCounter(int* counter) {
  __threadfence();
  const unsigned blocks = gridDim.x * gridDim.y * gridDim.z;
  if (static_cast<unsigned>(atomicAdd(counter + 1, 1)) == blocks - 1) {
    __threadfence();
    atomicExch(counter, 0);
    atomicExch(counter + 1, 0);
  }
}

// Merges the partial results of every split (sequence, head): block (m * heads + h, y) merges
// value dims 64y .. 64y + 63 of head h of merge item m. Its threads first turn the splits' lse
// into weights in shared memory (in rounds of kMergeChunk splits), then its 16 warps take the
// splits in turn (lane: two dims) with independent loads in flight, and add up through shared
// memory, so one long sequence cut into hundreds of splits is merged by many warps at once.
// o: [batch, heads, dim] of bf16 or fp16, lse: [batch, heads] or null. A (sequence, head) whose
// splits saw no token gets zeros and lse = -inf.
constexpr int kMergeWarps = 16;
constexpr int kMergeChunk = 1024;

template <bool kOutBf16, int kDim>
__global__ void __launch_bounds__(kMergeWarps * 32)
    MergePartialsKernel(const float* __restrict__ part_o, const float* __restrict__ part_lse,
                        const DecodeMergeItem* __restrict__ merges, int heads, void* __restrict__ o,
                        float* __restrict__ lse) {
  static_assert(kDim % 64 == 0, "dims in slices of 64");
  WaitForPrimary();
  __shared__ float s_w[kMergeChunk];
  __shared__ float s_acc[kMergeWarps][64];
  __shared__ float s_red[kMergeWarps];
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const DecodeMergeItem mi = merges[blockIdx.x / heads];
  const int h = blockIdx.x % heads;
  const int d0 = blockIdx.y * 64 + 2 * lane;
  const float* pl = part_lse + size_t{1} * mi.slot0 * heads + h;
  const float* po = part_o + (size_t{1} * mi.slot0 * heads + h) * kDim + d0;
  const size_t split_stride = size_t{1} * heads * kDim;
  float m = -INFINITY;
  for (int s = threadIdx.x; s < mi.splits; s += blockDim.x) m = fmaxf(m, pl[size_t{1} * s * heads]);
#pragma unroll
  for (int off = 16; off > 0; off /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
  if (lane == 0) s_red[warp] = m;
  __syncthreads();
  m = s_red[0];
#pragma unroll
  for (int w = 1; w < kMergeWarps; ++w) m = fmaxf(m, s_red[w]);
  float a0 = 0.0f, a1 = 0.0f, sum = 0.0f;
  if (m != -INFINITY) {  // (uniform across the block)
    for (int c0 = 0; c0 < mi.splits; c0 += kMergeChunk) {
      const int n = min(kMergeChunk, mi.splits - c0);
      __syncthreads();  // the previous round's weights are read
      for (int s = threadIdx.x; s < n; s += blockDim.x) {
        s_w[s] = __expf(pl[size_t{1} * (c0 + s) * heads] - m);  // exp(-inf) = 0
      }
      __syncthreads();
#pragma unroll 4
      for (int s = warp; s < n; s += kMergeWarps) {
        const float w = s_w[s];
        const float2 v = *reinterpret_cast<const float2*>(po + (c0 + s) * split_stride);
        sum += w;
        a0 += w * v.x;
        a1 += w * v.y;
      }
    }
  }
  s_acc[warp][2 * lane] = a0;
  s_acc[warp][2 * lane + 1] = a1;
  __syncthreads();
  if (lane == 0) s_red[warp] = sum;  // (m was read from s_red before the barrier above)
  __syncthreads();
  if (warp != 0) return;
  float t0 = 0.0f, t1 = 0.0f, total = 0.0f;
#pragma unroll
  for (int w = 0; w < kMergeWarps; ++w) {
    t0 += s_acc[w][2 * lane];
    t1 += s_acc[w][2 * lane + 1];
    total += s_red[w];
  }
  const float inv = total > 0.0f ? 1.0f / total : 0.0f;
  const size_t row = size_t{1} * mi.seq * heads + h;
  static_cast<uint32_t*>(o)[(row * kDim + d0) / 2] = PackFloat2<kOutBf16>(t0 * inv, t1 * inv);
  if (lse != nullptr && blockIdx.y == 0 && lane == 0) {
    lse[row] = total > 0.0f ? m + __logf(total) : -INFINITY;
  }
}

// The same for plans whose sequences have few splits (at most kFewSplits): one warp per
// (merge item, head) over all dims (lane: kDim / 32 values, consecutive pairs), four per block.
// Cheaper there than the kernel above, whose blocks would be mostly idle.
constexpr int kFewSplits = 32;

template <bool kOutBf16, int kDim>
__global__ void __launch_bounds__(128)
    MergeFewSplitsKernel(const float* __restrict__ part_o, const float* __restrict__ part_lse,
                         const DecodeMergeItem* __restrict__ merges, int num_merges, int heads,
                         void* __restrict__ o, float* __restrict__ lse) {
  WaitForPrimary();
  const int warp = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (warp >= num_merges * heads) return;
  const DecodeMergeItem mi = merges[warp / heads];
  const int h = warp % heads;
  const float* pl = part_lse + size_t{1} * mi.slot0 * heads + h;
  float m = -INFINITY;
  for (int s = lane; s < mi.splits; s += 32) m = fmaxf(m, pl[size_t{1} * s * heads]);
#pragma unroll
  for (int off = 16; off > 0; off /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
  constexpr int kPer = kDim / 32;
  float acc[kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i) acc[i] = 0.0f;
  float sum = 0.0f;
  if (m != -INFINITY) {
    for (int s = 0; s < mi.splits; ++s) {
      const float w = __expf(pl[size_t{1} * s * heads] - m);  // exp(-inf) = 0
      sum += w;
      const float* po = part_o + (size_t{1} * (mi.slot0 + s) * heads + h) * kDim;
#pragma unroll
      for (int i = 0; i < kPer; i += 2) {
        const float2 v = *reinterpret_cast<const float2*>(po + i * 32 + lane * 2);
        acc[i] += w * v.x;
        acc[i + 1] += w * v.y;
      }
    }
  }
  const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
  const size_t row = size_t{1} * mi.seq * heads + h;
  uint32_t* out = static_cast<uint32_t*>(o) + row * (kDim / 2);
#pragma unroll
  for (int i = 0; i < kPer; i += 2) {
    out[(i * 32 + lane * 2) / 2] = PackFloat2<kOutBf16>(acc[i] * inv, acc[i + 1] * inv);
  }
  if (lse != nullptr && lane == 0) lse[row] = sum > 0.0f ? m + __logf(sum) : -INFINITY;
}

// Merges a plan's split sequences (max_splits: the most splits of any of them), launched as a
// programmatic dependent of the attention kernel just before it on `stream` (see
// LaunchDependents), or plainly after it (`dependent` false: the benchmark's comparison).
template <bool kOutBf16, int kDim>
cudaError_t LaunchMergePartials(const PlanWorkspace& ws, int num_merges, int max_splits, int heads,
                                void* o, float* lse, bool dependent, cudaStream_t stream) {
  if (num_merges == 0) return cudaSuccess;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = dependent ? 1 : 0;
  // Where a stream or driver refuses the attribute, the merge is launched plainly (stream order).
  auto launch = [&](auto kernel, auto... args) {
    cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, args...);
    if (e == cudaErrorNotSupported || e == cudaErrorInvalidValue) {
      (void)cudaGetLastError();
      cfg.numAttrs = 0;
      e = cudaLaunchKernelEx(&cfg, kernel, args...);
    }
    return e;
  };
  const float* part_o = ws.part_o;
  const float* part_lse = ws.part_lse;
  if (max_splits <= kFewSplits) {
    const int warps = num_merges * heads;
    cfg.gridDim = dim3((warps + 3) / 4);
    cfg.blockDim = dim3(128);
    return launch(MergeFewSplitsKernel<kOutBf16, kDim>, part_o, part_lse, ws.merges, num_merges,
                  heads, o, lse);
  }
  cfg.gridDim = dim3(num_merges * heads, kDim / 64);
  cfg.blockDim = dim3(kMergeWarps * 32);
  return launch(MergePartialsKernel<kOutBf16, kDim>, part_o, part_lse, ws.merges, heads, o, lse);
}

// Uploads a plan's items and merges into the workspace and zeroes its work counter (on
// `stream`, from the plan's own host vectors, which must outlive the copy: the plan is kept by
// the caller).
inline cudaError_t UploadPlan(const SplitPlan& plan, const DecodeWorkspaceLayout& l, void* ws,
                              cudaStream_t stream) {
  auto* p = static_cast<uint8_t*>(ws);
  if (cudaError_t e = cudaMemsetAsync(p, 0, 2 * sizeof(int), stream); e != cudaSuccess) return e;
  if (!plan.items.empty()) {
    if (cudaError_t e = cudaMemcpyAsync(p + l.items, plan.items.data(),
                                        plan.items.size() * sizeof(DecodeWorkItem),
                                        cudaMemcpyHostToDevice, stream);
        e != cudaSuccess) {
      return e;
    }
  }
  if (!plan.merges.empty()) {
    return cudaMemcpyAsync(p + l.merges, plan.merges.data(),
                           plan.merges.size() * sizeof(DecodeMergeItem), cudaMemcpyHostToDevice,
                           stream);
  }
  return cudaSuccess;
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
