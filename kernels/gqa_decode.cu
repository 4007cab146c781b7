#include "kernels/gqa_decode.cuh"

#include <cooperative_groups.h>

#include <algorithm>
#include <array>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels/cuda_common.cuh"
#include "kernels/decode_common.cuh"
#include "kernels/tuning.h"

// Design (docs/kernels.md has the long form):
//  - A work item is (sequence, group of kWarps (kv head, <= 8 query heads) pairs, chunk of
//    tokens). The chunk is planned on the host (PlanSchedule) from a model of the whole launch:
//    each item costs about 5 us beyond its bytes (taking it, loading length, query and block
//    table, waiting for its first tile), so small batches get few large items rather than about
//    four per block. When the items fit the resident blocks, block i takes item i (no work
//    counter, no memset); otherwise persistent blocks take items from an atomic counter, so
//    ragged lengths balance themselves. One warp per kv head: the warps of a block stream the
//    same cache blocks at the same pace, so together they read every block's rows whole (all
//    heads of a token are adjacent in the engines' layouts), which DRAM serves much better than
//    the 256-byte pieces of one head.
//  - Each warp streams its 16-token tiles through a private shared-memory ring with cp.async:
//    every thread copies exactly the 16-byte pieces it later reads itself, so the pipeline
//    needs no barriers at all.
//  - Scores and outputs come from mma.sync m16n8k16: S = Q K^T with the query heads as the M
//    side (rows 8..15 unused), then O^T = V^T P^T with head_dim as the M side, so the score
//    fragment is already the P operand and no accumulator row is wasted. Which head_dim
//    element sits in which fragment slot is permuted so that every thread reads whole 16-byte
//    pieces of K and V rows; the query is loaded with the same permutation and the output is
//    un-permuted when it is written.
//  - Sequences longer than one chunk write partial results that MergeSplitsKernel combines, or,
//    when the planned items fit the GPU with each sequence's 2..8 splits as one thread block
//    cluster, the splits leave their partials in shared memory and the cluster's rank 0 merges
//    them over distributed shared memory (ClusterMerge): no merge kernel and no partials in HBM.
//    Measured no faster on the GPU than the merge kernel (docs/benchmarks.md), but one launch
//    fewer for the host.

namespace kvpool::kernels {
namespace {

using detail::Bf16Tag;
using detail::Fp16Tag;
using detail::Fp8Tag;
using detail::KvTraits;

struct GqaParams {
  const void* q;
  const uint8_t* kv;
  int64_t v_offset;  // bytes
  int64_t block_stride;
  int64_t token_stride;
  int64_t head_stride;
  const int32_t* block_tables;
  const int32_t* seq_lens;
  void* o;
  float* lse;
  detail::SplitWorkspace ws;
  int batch;
  int num_qo_heads;
  int num_kv_heads;
  int group;    // query heads per kv head
  int qchunks;  // groups of 8 query heads per kv head
  int pairs;    // num_kv_heads * qchunks: one warp each
  int hgroups;  // ceil(pairs / warps per block)
  int block_size;
  int max_blocks_per_seq;
  int chunk;  // tokens per work item, a multiple of 16
  int max_splits;
  int total_items;
  int one_item;  // 1: one item per block, block i takes item i (no work counter)
  // 1 (with one_item): the max_splits splits of a (sequence, head group) are one thread block
  // cluster, block rank = split; partials stay in shared memory and rank 0 merges them.
  int cluster;
  float scale_log2;  // sm_scale * k_scale * log2(e)
  float v_scale;
};

constexpr unsigned kFull = 0xffffffffu;
constexpr int kSmemBudget = 200 * 1024;

template <typename KV, int kDim, int kWarps>
struct GqaConfig {
  static constexpr int kEB = KvTraits<KV>::kBytes;
  static constexpr bool kMmaBf16 = KvTraits<KV>::kMmaBf16;
  static constexpr int kRow = kDim * kEB;           // bytes of one K or V row
  static constexpr int kNKC = kRow / 64;            // 16-byte K pieces per row per thread
  static constexpr int kCV = kRow >= 128 ? 16 : 8;  // bytes of one V piece
  static constexpr int kNVC = kRow / (8 * kCV);     // V pieces per row per thread
  static constexpr int kEK = 16 / kEB;              // elements per K piece
  static constexpr int kEV = kCV / kEB;             // elements per V piece
  static constexpr int kKSteps = kDim / 16;
  static constexpr int kMTiles = kDim / 16;
  static constexpr int kStageBytes = 32 * kRow;  // per warp: 16 tokens of K and V
  static constexpr int kKBytes = 16 * kRow;      // K half of a stage
  static constexpr int kFit = kSmemBudget / (kWarps * kStageBytes);
  static constexpr int kStages = kFit > 4 ? 4 : kFit;
  static constexpr int kSmemBytes = kWarps * kStages * kStageBytes;
  // Rows of at least 128 bytes are copied warp-wide in whole 16-byte chunks, row after row, so
  // each copy instruction asks L2 for whole 128-byte lines (two 256-byte rows per instruction
  // for d128 bf16), into row-major tiles whose 16-byte chunks are XOR-swizzled (Swizzle()) so
  // that the fragment loads below hit distinct banks. 64-byte rows (e4m3, d64) keep a
  // thread-private layout: each thread copies exactly the pieces it reads.
  static constexpr bool kRowMajor = kRow >= 128;
  static constexpr int kChunksPerRow = kRow / 16;
  static_assert(kNKC >= 1 && kNVC >= 1 && kChunksPerRow >= 4, "head_dim too small");
};

// Swizzle of 16-byte chunk c in row `row` of a row-major tile: flips the low three bits so
// that both the K reads (rows 2m, 2m+1; chunks qd + 4i) and the V reads (rows 2qd + const;
// chunks r + 8i) of a quarter warp land on eight distinct 16-byte bank groups.
__device__ __forceinline__ int Swizzle(int row, int c) {
  return c ^ ((row & 6) ^ ((row & 1) << 2));
}

// Largest warps per block whose pipelines (at least 2 stages each) fit the budget.
template <typename KV, int kDim>
constexpr int MaxWarps() {
  constexpr int kStage = 32 * kDim * KvTraits<KV>::kBytes;
  return kSmemBudget / (8 * kStage) >= 2 ? 8 : (kSmemBudget / (4 * kStage) >= 2 ? 4 : 2);
}

// The cluster's merge (GqaParams::cluster): every block of the cluster has its partials in its
// warps' shared memory at `warp_offset` (one_item: every thread gets here after one round).
// Rank 0 merges them as MergeSplitsKernel does; the second barrier keeps the other blocks'
// shared memory alive until it has read them. Not inlined, so that it costs the attention loop
// no registers.
template <bool kQBf16, int kDim>
__device__ __noinline__ void ClusterMerge(const GqaParams& p, uint8_t* smem, int warp_offset,
                                          int warps) {
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int split = blockIdx.x % p.max_splits;
  const int t = blockIdx.x / p.max_splits;
  const int hg = t % p.hgroups;
  const int b = t / p.hgroups;
  const int pair = hg * warps + warp;
  const int len = pair < p.pairs ? p.seq_lens[b] : 0;
  const int nsplit = max(1, (len + p.chunk - 1) / p.chunk);
  if (split == 0 && nsplit > 1) {
    const int g0 = (pair % p.qchunks) * 8;
    const int grows = min(8, p.group - g0);
    const int head0 = (pair / p.qchunks) * p.group + g0;
    float* mine = reinterpret_cast<float*>(smem + warp_offset);
    constexpr int kPer = kDim / 32;  // values per lane, consecutive pairs
    for (int g = 0; g < grows; ++g) {
      float m = -INFINITY;
      for (int sp = 0; sp < nsplit; ++sp) {
        m = fmaxf(m, cluster.map_shared_rank(mine, sp)[8 * kDim + g]);
      }
      float acc[kPer];
#pragma unroll
      for (int i = 0; i < kPer; ++i) acc[i] = 0.0f;
      float sum = 0.0f;
      for (int sp = 0; sp < nsplit; ++sp) {
        const float* part = cluster.map_shared_rank(mine, sp);
        const float w = __expf(part[8 * kDim + g] - m);
        sum += w;
#pragma unroll
        for (int i = 0; i < kPer; i += 2) {
          const float2 v = *reinterpret_cast<const float2*>(part + g * kDim + i * 32 + lane * 2);
          acc[i] += w * v.x;
          acc[i + 1] += w * v.y;
        }
      }
      const float inv = 1.0f / sum;
      const size_t row = size_t{1} * b * p.num_qo_heads + head0 + g;
      uint32_t* out = static_cast<uint32_t*>(p.o) + row * (kDim / 2);
#pragma unroll
      for (int i = 0; i < kPer; i += 2) {
        out[(i * 32 + lane * 2) / 2] = detail::PackFloat2<kQBf16>(acc[i] * inv, acc[i + 1] * inv);
      }
      if (p.lse != nullptr && lane == 0) p.lse[row] = m + __logf(sum);
    }
  }
  cluster.sync();
}

template <typename KV, bool kQBf16, int kDim, int kWarps>
__global__ void __launch_bounds__(kWarps * 32)
    GqaDecodeKernel(const __grid_constant__ GqaParams p) {
  using C = GqaConfig<KV, kDim, kWarps>;
  static_assert(C::kStages >= 2, "pipeline does not fit shared memory");
  constexpr bool kFp8 = std::is_same_v<KV, Fp8Tag>;
  constexpr bool kMB = C::kMmaBf16;
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ int s_item;

  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int r = lane / 4;  // fragment row group
  const int qd = lane % 4;
  const uint32_t pipe = detail::SmemAddr(smem) + warp * C::kStages * C::kStageBytes;

  for (int round = 0;; ++round) {
    int item;
    if (p.one_item) {
      if (round > 0) break;
      item = blockIdx.x;  // the grid is exactly total_items blocks: no counter, no barrier
    } else {
      if (threadIdx.x == 0) s_item = atomicAdd(p.ws.counter, 1);
      __syncthreads();
      item = s_item;
      __syncthreads();
      if (item >= p.total_items) break;
    }
    int t = item;
    int split = 0;
    if (p.cluster) {
      split = t % p.max_splits;
      t /= p.max_splits;
    }
    const int hg = t % p.hgroups;
    t /= p.hgroups;
    const int b = t % p.batch;
    if (!p.cluster) split = t / p.batch;
    const int pair = hg * kWarps + warp;
    if (pair >= p.pairs) continue;  // idle warp of the last head group (no barriers below)
    const int len = p.seq_lens[b];
    const int nsplit = max(1, (len + p.chunk - 1) / p.chunk);
    if (split >= nsplit) continue;
    const int h = pair / p.qchunks;
    const int g0 = (pair % p.qchunks) * 8;
    const int grows = min(8, p.group - g0);
    const int head0 = h * p.group + g0;  // first query head of this warp
    const int start = split * p.chunk;
    const int end = min(len, start + p.chunk);

    // Query fragments (A of S = Q K^T): row r = query head head0 + r; rows 8..15 are zero.
    uint32_t qlo[C::kKSteps], qhi[C::kKSteps];
    {
      const uint4* qrow = reinterpret_cast<const uint4*>(
          static_cast<const uint16_t*>(p.q) + (size_t{1} * b * p.num_qo_heads + head0 + r) * kDim);
#pragma unroll
      for (int i = 0; i < C::kNKC; ++i) {
        // Piece i of this thread covers elements [kEK * (qd + 4i), +kEK).
        constexpr int kQVecs = C::kEK / 8;  // 16-byte vectors of the query per piece
#pragma unroll
        for (int v = 0; v < kQVecs; ++v) {
          uint4 x = make_uint4(0, 0, 0, 0);
          if (r < grows) x = qrow[(C::kEK * (qd + 4 * i)) / 8 + v];
          const uint32_t w[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
          for (int m2 = 0; m2 < 2; ++m2) {
            const int ks = i * (C::kEK / 4) + v * 2 + m2;  // 4 elements per k-step and thread
            qlo[ks] = detail::ConvertPair<kQBf16, kMB>(w[2 * m2]);
            qhi[ks] = detail::ConvertPair<kQBf16, kMB>(w[2 * m2 + 1]);
          }
        }
      }
    }

    const int ntiles = (end - start + 15) / 16;
    const int32_t* table = p.block_tables + size_t{1} * b * p.max_blocks_per_seq;
    // Lane i holds the physical block of tile k0 + i.
    auto load_blocks = [&](int k0) {
      const int k = k0 + lane;
      return k < ntiles ? __ldg(table + (start + 16 * k) / p.block_size) : 0;
    };
    int blocks = load_blocks(0);
    const uint8_t* head_base = p.kv + h * p.head_stride;

    auto issue = [&](int k) {
      if (k > 0 && (k & 31) == 0) blocks = load_blocks(k);
      const int blk = __shfl_sync(kFull, blocks, k & 31);
      const int tok0 = start + 16 * k;
      const int nvalid = min(16, end - tok0);
      const uint8_t* base =
          head_base + blk * p.block_stride + (tok0 % p.block_size) * p.token_stride;
      const uint32_t st = pipe + (k % C::kStages) * C::kStageBytes;
      if constexpr (C::kRowMajor) {
        // K rows 0..15, then V rows 0..15: chunk q of the tile goes to row q / kChunksPerRow.
#pragma unroll
        for (int kv = 0; kv < 2; ++kv) {
#pragma unroll
          for (int j = 0; j < C::kChunksPerRow / 2; ++j) {
            const int q = j * 32 + lane;
            const int row = q / C::kChunksPerRow;
            const int c = q % C::kChunksPerRow;
            const bool ok = row < nvalid;
            const uint8_t* src = base + (kv ? p.v_offset : 0) + row * p.token_stride + c * 16;
            detail::CpAsync16(st + kv * C::kKBytes + row * C::kRow + Swizzle(row, c) * 16,
                              ok ? src : base, ok ? 16 : 0);
          }
        }
      } else {
#pragma unroll
        for (int n = 0; n < 2; ++n) {
          const int j = 8 * n + r;
          const bool ok = j < nvalid;
          const uint8_t* row = base + j * p.token_stride;
#pragma unroll
          for (int i = 0; i < C::kNKC; ++i) {
            detail::CpAsync16(st + ((n * C::kNKC + i) * 32 + lane) * 16,
                              ok ? row + (qd + 4 * i) * 16 : base, ok ? 16 : 0);
          }
        }
#pragma unroll
        for (int rr = 0; rr < 4; ++rr) {
          const int j = 2 * qd + (rr & 1) + (rr >> 1) * 8;
          const bool ok = j < nvalid;
          const uint8_t* row = base + p.v_offset + j * p.token_stride;
#pragma unroll
          for (int i = 0; i < C::kNVC; ++i) {
            const uint32_t dst = st + C::kKBytes + ((rr * C::kNVC + i) * 32 + lane) * C::kCV;
            const uint8_t* src = ok ? row + (r + 8 * i) * C::kCV : base;
            if constexpr (C::kCV == 16) {
              detail::CpAsync16(dst, src, ok ? 16 : 0);
            } else {
              detail::CpAsync8(dst, src, ok ? 8 : 0);
            }
          }
        }
      }
    };

    float m_run = -INFINITY;  // running max of row r (log2 domain)
    float l_run = 0.0f;       // this thread's share of the running sum of row r
    float acc[C::kMTiles][4];
#pragma unroll
    for (int i = 0; i < C::kMTiles; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;

#pragma unroll
    for (int k = 0; k < C::kStages - 1; ++k) {
      if (k < ntiles) issue(k);
      detail::CpAsyncCommit();
    }
    for (int k = 0; k < ntiles; ++k) {
      // Row-major tiles are shared by the lanes: every lane is done reading tile k - 1 before
      // its stage is refilled, and sees the other lanes' copies of tile k.
      if constexpr (C::kRowMajor) __syncwarp();
      if (k + C::kStages - 1 < ntiles) issue(k + C::kStages - 1);
      detail::CpAsyncCommit();
      detail::CpAsyncWait<C::kStages - 1>();
      if constexpr (C::kRowMajor) __syncwarp();
      const uint32_t st = pipe + (k % C::kStages) * C::kStageBytes;
      const int tok0 = start + 16 * k;

      // S = Q K^T for 16 tokens: n-tile n holds tokens 8n..8n+7 of the tile.
      float s[2][4];
#pragma unroll
      for (int n = 0; n < 2; ++n) {
        s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
        for (int i = 0; i < C::kNKC; ++i) {
          const int krow = 8 * n + r;
          const uint4 x =
              detail::LdShared16(C::kRowMajor ? st + krow * C::kRow + Swizzle(krow, qd + 4 * i) * 16
                                              : st + ((n * C::kNKC + i) * 32 + lane) * 16);
          if constexpr (kFp8) {
            uint32_t pr[8];
            detail::Fp8x4ToHalf2x2(x.x, pr[0], pr[1]);
            detail::Fp8x4ToHalf2x2(x.y, pr[2], pr[3]);
            detail::Fp8x4ToHalf2x2(x.z, pr[4], pr[5]);
            detail::Fp8x4ToHalf2x2(x.w, pr[6], pr[7]);
#pragma unroll
            for (int m = 0; m < 4; ++m) {
              const int ks = i * 4 + m;
              detail::Mma16816<kMB>(s[n], qlo[ks], 0u, qhi[ks], 0u, pr[2 * m], pr[2 * m + 1]);
            }
          } else {
            detail::Mma16816<kMB>(s[n], qlo[2 * i], 0u, qhi[2 * i], 0u, x.x, x.y);
            detail::Mma16816<kMB>(s[n], qlo[2 * i + 1], 0u, qhi[2 * i + 1], 0u, x.z, x.w);
          }
        }
      }

      // Online softmax over row r (columns: tokens 8n + 2qd + e).
      float sv[2][2];
      float mx = -INFINITY;
#pragma unroll
      for (int n = 0; n < 2; ++n) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const bool ok = tok0 + 8 * n + 2 * qd + e < end;
          sv[n][e] = ok ? s[n][e] * p.scale_log2 : -INFINITY;
          mx = fmaxf(mx, sv[n][e]);
        }
      }
      mx = fmaxf(mx, __shfl_xor_sync(kFull, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(kFull, mx, 2));
      const float m_new = fmaxf(m_run, mx);  // finite: token 0 of a tile is always valid
      const float alpha = exp2f(m_run - m_new);
      float pv[2][2];
      float psum = 0.0f;
#pragma unroll
      for (int n = 0; n < 2; ++n) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          pv[n][e] = exp2f(sv[n][e] - m_new);
          psum += pv[n][e];
        }
      }
      l_run = l_run * alpha + psum;
      m_run = m_new;
      // Output columns are query rows 2qd and 2qd + 1: their factors live in lanes 8qd, 8qd+4.
      const float a0 = __shfl_sync(kFull, alpha, 8 * qd);
      const float a1 = __shfl_sync(kFull, alpha, 8 * qd + 4);
#pragma unroll
      for (int i = 0; i < C::kMTiles; ++i) {
        acc[i][0] *= a0;
        acc[i][1] *= a1;
        acc[i][2] *= a0;
        acc[i][3] *= a1;
      }
      const uint32_t pb0 = detail::PackFloat2<kMB>(pv[0][0], pv[0][1]);
      const uint32_t pb1 = detail::PackFloat2<kMB>(pv[1][0], pv[1][1]);

      // O^T += V^T P^T: V rows of tokens 2qd, 2qd+1, 2qd+8, 2qd+9; m-tile mu uses value
      // slots 2mu (rows r) and 2mu+1 (rows r+8) of this thread's pieces.
#pragma unroll
      for (int i = 0; i < C::kNVC; ++i) {
        constexpr int kPairs = C::kEV / 2;  // 16-bit pairs per piece
        uint32_t x[4][kPairs];
#pragma unroll
        for (int rr = 0; rr < 4; ++rr) {
          const int vrow = 2 * qd + (rr & 1) + (rr >> 1) * 8;
          const uint32_t addr =
              C::kRowMajor ? st + C::kKBytes + vrow * C::kRow + Swizzle(vrow, r + 8 * i) * 16
                           : st + C::kKBytes + ((rr * C::kNVC + i) * 32 + lane) * C::kCV;
          if constexpr (kFp8) {
            if constexpr (C::kCV == 16) {
              const uint4 v = detail::LdShared16(addr);
              detail::Fp8x4ToHalf2x2(v.x, x[rr][0], x[rr][1]);
              detail::Fp8x4ToHalf2x2(v.y, x[rr][2], x[rr][3]);
              detail::Fp8x4ToHalf2x2(v.z, x[rr][4], x[rr][5]);
              detail::Fp8x4ToHalf2x2(v.w, x[rr][6], x[rr][7]);
            } else {
              const uint2 v = detail::LdShared8(addr);
              detail::Fp8x4ToHalf2x2(v.x, x[rr][0], x[rr][1]);
              detail::Fp8x4ToHalf2x2(v.y, x[rr][2], x[rr][3]);
            }
          } else {
            const uint4 v = detail::LdShared16(addr);
            x[rr][0] = v.x;
            x[rr][1] = v.y;
            x[rr][2] = v.z;
            x[rr][3] = v.w;
          }
        }
#pragma unroll
        for (int pp = 0; pp < kPairs; ++pp) {
          const int mu = i * kPairs + pp;
          detail::Mma16816<kMB>(acc[mu], __byte_perm(x[0][pp], x[1][pp], 0x5410),
                                __byte_perm(x[0][pp], x[1][pp], 0x7632),
                                __byte_perm(x[2][pp], x[3][pp], 0x5410),
                                __byte_perm(x[2][pp], x[3][pp], 0x7632), pb0, pb1);
        }
      }
    }

    // This warp's results: row r's sum and max, then the output columns 2qd and 2qd + 1.
    l_run += __shfl_xor_sync(kFull, l_run, 1);
    l_run += __shfl_xor_sync(kFull, l_run, 2);
    const float inv_row = l_run > 0.0f ? p.v_scale / l_run : 0.0f;
    const float lse_row = l_run > 0.0f ? (m_run + __log2f(l_run)) * detail::kLn2 : -INFINITY;
    const float inv0 = __shfl_sync(kFull, inv_row, 8 * qd);
    const float inv1 = __shfl_sync(kFull, inv_row, 8 * qd + 4);
    const bool direct = nsplit == 1;
    if (p.cluster && !direct) {
      // Into this warp's own ring, in head_dim order: rows g of kDim floats, then 8 lse.
      __syncwarp();  // every lane is done reading the last tile
      float* part = reinterpret_cast<float*>(smem + warp * C::kStages * C::kStageBytes);
#pragma unroll
      for (int col = 0; col < 2; ++col) {
        const int g = 2 * qd + col;
        if (g >= grows) continue;
        const float inv = col ? inv1 : inv0;
#pragma unroll
        for (int mu = 0; mu < C::kMTiles; ++mu) {
          const int d = C::kEV * (r + 8 * ((2 * mu) / C::kEV)) + (2 * mu) % C::kEV;
          *reinterpret_cast<float2*>(part + g * kDim + d) =
              make_float2(acc[mu][col] * inv, acc[mu][2 + col] * inv);
        }
      }
      if (qd == 0 && r < grows) part[8 * kDim + r] = lse_row;
      continue;
    }
#pragma unroll
    for (int col = 0; col < 2; ++col) {
      const int g = 2 * qd + col;
      if (g >= grows) continue;
      const float inv = col ? inv1 : inv0;
      const size_t out_row =
          direct ? size_t{1} * b * p.num_qo_heads + head0 + g
                 : (size_t{1} * b * p.max_splits + split) * p.num_qo_heads + head0 + g;
#pragma unroll
      for (int mu = 0; mu < C::kMTiles; ++mu) {
        // Slots 2mu (c0/c1) and 2mu+1 (c2/c3) are adjacent head_dim elements.
        const int d = C::kEV * (r + 8 * ((2 * mu) / C::kEV)) + (2 * mu) % C::kEV;
        const float v0 = acc[mu][col] * inv, v1 = acc[mu][2 + col] * inv;
        if (direct) {
          static_cast<uint32_t*>(p.o)[(out_row * kDim + d) / 2] =
              detail::PackFloat2<kQBf16>(v0, v1);
        } else {
          *reinterpret_cast<float2*>(p.ws.part_o + out_row * kDim + d) = make_float2(v0, v1);
        }
      }
    }
    if (qd == 0 && r < grows) {
      if (direct) {
        if (p.lse != nullptr) p.lse[size_t{1} * b * p.num_qo_heads + head0 + r] = lse_row;
      } else {
        p.ws.part_lse[(size_t{1} * b * p.max_splits + split) * p.num_qo_heads + head0 + r] =
            lse_row;
      }
    }
  }

  if (p.cluster) ClusterMerge<kQBf16, kDim>(p, smem, warp * C::kStages * C::kStageBytes, kWarps);
}

// Tokens per work item under the previous schedule (KernelTuning::gqa_schedule = 1): about 4
// items per resident block, at least 256 tokens, and at most max_splits_cap splits per sequence
// (0: no cap).
int ChunkFor(int batch, int hgroups, int max_seq_len, int ctas, int max_splits_cap) {
  return detail::ChooseChunk(int64_t{batch} * hgroups, max_seq_len, ctas, /*granule=*/16,
                             /*min_chunk=*/256, /*waves=*/4, max_splits_cap);
}

// What a schedule costs, in microseconds, as the planner below models it. tile_us comes from the
// read ceiling (about 4.6 TB/s on the H200) shared by all resident blocks; the fixed costs were
// read off the benchmark (docs/benchmarks.md): with about five items per block the small rows
// lost about 30 us whatever their size.
struct ScheduleModel {
  double tile_us;     // one block streaming one 16-token tile of its heads' K and V
  double item_us;     // per item: taking it, loading length, query and block table, first tile
  double counter_us;  // the work counter's reset (a memset before the kernel)
  double merge_us;    // the merge kernel's launch and tail
  double merge_bytes_per_us;  // partial results written and read back
  double cluster_merge_us;    // merging in a cluster instead (two cluster barriers, DSMEM reads)
};

constexpr double kReadBytesPerUs = 4.6e6;

// Finish time of the last block when `units` (sequence, head group) pairs of `tiles` tiles each
// are cut into items of `chunk_tiles` and taken in the kernel's order (split after split) by
// whichever of `ctas` blocks is free first; every sequence at full length. Blocks that finish at
// the same time form one level, and there are only a few levels.
double Makespan(int64_t units, int64_t tiles, int64_t chunk_tiles, int ctas,
                const ScheduleModel& m) {
  std::vector<std::pair<double, int64_t>> levels = {{0.0, ctas}};  // (finish time, blocks)
  auto take = [&](int64_t items, double cost) {
    while (items > 0) {
      const auto [t, k] = levels.front();
      const int64_t n = std::min(k, items);
      if (n == k) {
        levels.erase(levels.begin());
      } else {
        levels.front().second -= n;
      }
      const double done = t + cost;
      auto it = std::lower_bound(levels.begin(), levels.end(), done,
                                 [](const auto& l, double v) { return l.first < v; });
      if (it != levels.end() && it->first == done) {
        it->second += n;
      } else {
        levels.insert(it, {done, n});
      }
      items -= n;
    }
  };
  const int64_t splits = (tiles + chunk_tiles - 1) / chunk_tiles;
  if (splits > 1) take(units * (splits - 1), chunk_tiles * m.tile_us + m.item_us);
  take(units, (tiles - (splits - 1) * chunk_tiles) * m.tile_us + m.item_us);
  return levels.back().first;
}

struct Schedule {
  int chunk = 0;          // tokens per item, a multiple of 16
  bool one_item = false;  // no more items than resident blocks: block i takes item i
  bool cluster = false;   // one_item, and each sequence's splits merged inside their cluster
};

// The planned schedule: of the previous chunk and every cut into n = 1, 2, ... equal chunks (up
// to eight waves of items), the one of least modelled cost (Makespan, plus the merge kernel
// or the merge inside clusters when sequences are split, and the counter's reset when there are
// more items than blocks). The previous chunk is kept unless another is at least 2% cheaper.
// split_bytes: partial results of one split over the whole batch. max_clusters[n]: clusters of
// n blocks that can be resident at once (n = 2..kMaxCluster), or null for no clusters.
constexpr int kMaxCluster = 8;

Schedule PlanSchedule(int64_t units, int max_seq_len, int ctas, int max_splits_cap,
                      int64_t split_bytes, const ScheduleModel& m, int previous_chunk,
                      const int* max_clusters) {
  const int64_t tiles = std::max(1, (max_seq_len + 15) / 16);
  auto clustered = [&](int64_t chunk_tiles) {
    const int64_t splits = (tiles + chunk_tiles - 1) / chunk_tiles;
    return max_clusters != nullptr && splits > 1 && splits <= kMaxCluster &&
           units <= max_clusters[splits];
  };
  auto cost = [&](int64_t chunk_tiles) {
    const int64_t splits = (tiles + chunk_tiles - 1) / chunk_tiles;
    double c = Makespan(units, tiles, chunk_tiles, ctas, m);
    if (clustered(chunk_tiles)) {
      c += m.cluster_merge_us;
    } else if (splits > 1) {
      c += m.merge_us + 2.0 * splits * split_bytes / m.merge_bytes_per_us;
    }
    if (units * splits > ctas) c += m.counter_us;
    return c;
  };
  const int64_t prev_tiles = std::max(1, previous_chunk / 16);
  const double prev_cost = cost(prev_tiles);
  int64_t best_tiles = prev_tiles;
  double best_cost = prev_cost;
  int64_t last = 0;
  for (int64_t n = 1; n <= tiles; ++n) {
    const int64_t chunk_tiles = (tiles + n - 1) / n;
    if (chunk_tiles == last) continue;
    last = chunk_tiles;
    const int64_t splits = (tiles + chunk_tiles - 1) / chunk_tiles;
    if (max_splits_cap >= 1 && splits > max_splits_cap) break;
    if (units * splits > int64_t{8} * ctas) break;
    const double c = cost(chunk_tiles);
    if (c < best_cost) {
      best_cost = c;
      best_tiles = chunk_tiles;
    }
  }
  if (best_cost > 0.98 * prev_cost) best_tiles = prev_tiles;
  const int64_t splits = (tiles + best_tiles - 1) / best_tiles;
  const bool one_item = units * splits <= ctas;
  return {static_cast<int>(best_tiles * 16), one_item, one_item && clustered(best_tiles)};
}

template <typename KV, bool kQBf16, int kDim, int kWarps>
struct GqaLauncher {
  using C = GqaConfig<KV, kDim, kWarps>;

  // Resident thread blocks for the whole GPU (0 on error).
  static int ResidentCtas() {
    static const int ctas = [] {
      auto kernel = GqaDecodeKernel<KV, kQBf16, kDim, kWarps>;
      if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               C::kSmemBytes) != cudaSuccess) {
        return 0;
      }
      int per_sm = 0;
      if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kWarps * 32,
                                                        C::kSmemBytes) != cudaSuccess) {
        return 0;
      }
      return per_sm * detail::NumSms();
    }();
    return ctas;
  }

  // Clusters of n blocks (index n = 2..kMaxCluster) that fit the GPU at once; 0 where the
  // query fails. Called after ResidentCtas (which sets the shared-memory attribute).
  static const int* MaxClusters() {
    static const std::array<int, kMaxCluster + 1> clusters = [] {
      std::array<int, kMaxCluster + 1> n{};
      for (int size = 2; size <= kMaxCluster; ++size) {
        cudaLaunchConfig_t config = {};
        config.gridDim = dim3(size);
        config.blockDim = dim3(kWarps * 32);
        config.dynamicSmemBytes = C::kSmemBytes;
        cudaLaunchAttribute attr;
        attr.id = cudaLaunchAttributeClusterDimension;
        attr.val.clusterDim.x = size;
        attr.val.clusterDim.y = 1;
        attr.val.clusterDim.z = 1;
        config.attrs = &attr;
        config.numAttrs = 1;
        if (cudaOccupancyMaxActiveClusters(&n[size], GqaDecodeKernel<KV, kQBf16, kDim, kWarps>,
                                           &config) != cudaSuccess) {
          n[size] = 0;
          (void)cudaGetLastError();
        }
      }
      return n;
    }();
    return clusters.data();
  }

  // The previous schedule or the planned one, with at most max_splits_cap splits per sequence
  // (0: no cap).
  static Schedule Choose(const GqaParams& p, int max_seq_len, int ctas, int max_splits_cap,
                         bool previous_schedule, bool use_clusters) {
    const int previous = ChunkFor(p.batch, p.hgroups, max_seq_len, ctas, max_splits_cap);
    if (previous_schedule) return {previous, false, false};
    ScheduleModel m;
    const double tile_bytes = 16.0 * kWarps * 2 * kDim * C::kEB;
    m.tile_us = tile_bytes * ctas / kReadBytesPerUs;
    m.item_us = 5.0;
    m.counter_us = 2.0;
    m.merge_us = 4.0;
    m.merge_bytes_per_us = 3.0e6;
    m.cluster_merge_us = 1.0;
    const int64_t split_bytes = int64_t{4} * p.batch * p.num_qo_heads * (kDim + 1);
    return PlanSchedule(int64_t{p.batch} * p.hgroups, max_seq_len, ctas, max_splits_cap,
                        split_bytes, m, previous, use_clusters ? MaxClusters() : nullptr);
  }

  // With `need` set, only computes the workspace this call would use at most and stores it.
  static cudaError_t Run(GqaParams p, int max_seq_len, size_t workspace_bytes, void* workspace,
                         cudaStream_t stream, size_t* need) {
    const int ctas = ResidentCtas();
    if (ctas <= 0) return cudaErrorInvalidConfiguration;
    p.hgroups = (p.pairs + kWarps - 1) / kWarps;
    if (need != nullptr) {
      // Room for either schedule, so that the benchmark can switch between them.
      const int previous = ChunkFor(p.batch, p.hgroups, max_seq_len, ctas, 0);
      const int planned = Choose(p, max_seq_len, ctas, 0, false, true).chunk;
      const int unclustered = Choose(p, max_seq_len, ctas, 0, false, false).chunk;
      const int splits = std::max({detail::NumSplits(max_seq_len, previous),
                                   detail::NumSplits(max_seq_len, planned),
                                   detail::NumSplits(max_seq_len, unclustered)});
      *need = detail::SplitWorkspaceBytes(p.batch, splits, p.num_qo_heads, kDim);
      return cudaSuccess;
    }
    if (workspace_bytes < detail::kCounterBytes) return cudaErrorInvalidValue;
    const int64_t per_split = int64_t{4} * p.batch * p.num_qo_heads * (kDim + 1);
    const int cap = static_cast<int>(std::clamp<int64_t>(
        (static_cast<int64_t>(workspace_bytes) - detail::kCounterBytes) / per_split, 1, 1 << 20));
    const KernelTuning& tuning = GetKernelTuning();
    Schedule sched =
        Choose(p, max_seq_len, ctas, cap, tuning.gqa_schedule == 1, tuning.gqa_schedule == 0);
    if (tuning.gqa_chunk > 0 && tuning.gqa_chunk % 16 == 0 &&
        detail::NumSplits(max_seq_len, tuning.gqa_chunk) <= cap) {
      // Benchmark sweeps: this chunk, with the planner's rules for the rest.
      sched.chunk = tuning.gqa_chunk;
      const int splits = detail::NumSplits(max_seq_len, sched.chunk);
      const int64_t units = int64_t{p.batch} * p.hgroups;
      sched.one_item = units * splits <= ctas;
      sched.cluster = tuning.gqa_schedule == 0 && sched.one_item && splits > 1 &&
                      splits <= kMaxCluster && units <= MaxClusters()[splits];
    }
    const int chunk = sched.chunk;
    p.chunk = chunk;
    p.max_splits = detail::NumSplits(max_seq_len, chunk);
    p.ws = detail::CarveSplitWorkspace(workspace, p.batch, p.max_splits, p.num_qo_heads);
    const int64_t items = int64_t{p.max_splits} * p.batch * p.hgroups;
    if (items > INT32_MAX) return cudaErrorInvalidValue;
    p.total_items = static_cast<int>(items);
    p.one_item = sched.one_item ? 1 : 0;
    if (!sched.one_item) {
      if (cudaError_t e = cudaMemsetAsync(p.ws.counter, 0, sizeof(int), stream); e != cudaSuccess) {
        return e;
      }
    }
    p.cluster = sched.cluster ? 1 : 0;
    const int grid = static_cast<int>(std::min<int64_t>(ctas, items));
    SetLastGqaSchedule({chunk, p.max_splits, p.total_items, grid, sched.one_item, sched.cluster});
    if (sched.cluster) {
      cudaLaunchConfig_t config = {};
      config.gridDim = dim3(grid);
      config.blockDim = dim3(kWarps * 32);
      config.dynamicSmemBytes = C::kSmemBytes;
      config.stream = stream;
      cudaLaunchAttribute attr;
      attr.id = cudaLaunchAttributeClusterDimension;
      attr.val.clusterDim.x = p.max_splits;
      attr.val.clusterDim.y = 1;
      attr.val.clusterDim.z = 1;
      config.attrs = &attr;
      config.numAttrs = 1;
      return cudaLaunchKernelEx(&config, GqaDecodeKernel<KV, kQBf16, kDim, kWarps>, p);
    }
    GqaDecodeKernel<KV, kQBf16, kDim, kWarps><<<grid, kWarps * 32, C::kSmemBytes, stream>>>(p);
    if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
    if (p.max_splits > 1) {
      return detail::LaunchMergeSplits<kQBf16, kDim>(p.ws, p.seq_lens, p.batch, p.num_qo_heads,
                                                     p.max_splits, chunk, p.o, p.lse, stream);
    }
    return cudaSuccess;
  }
};

// Warps per block: one per (kv head, query group) pair, four by default. With d128 bf16 that is
// still one block per SM, but each warp's ring is 4 stages deep instead of 3; measured as fast
// as eight heads per block or faster under the previous schedule. Under the planned one, eight
// heads per block measured the same at batch 32 x 4k and 2-3% faster at 128 x 4k (a lead; kept
// as a benchmark variant, see docs/benchmarks.md).
template <typename KV, bool kQBf16, int kDim>
cudaError_t DispatchWarps(GqaParams& p, int max_seq_len, size_t ws_bytes, void* ws,
                          cudaStream_t stream, size_t* need) {
  constexpr int kMax = MaxWarps<KV, kDim>();
  if (p.pairs >= 8 && kMax >= 8 && GetKernelTuning().gqa_warps == 8) {
    return GqaLauncher<KV, kQBf16, kDim, (kMax >= 8 ? 8 : 2)>::Run(p, max_seq_len, ws_bytes, ws,
                                                                   stream, need);
  }
  if (p.pairs >= 3 && kMax >= 4) {
    return GqaLauncher<KV, kQBf16, kDim, (kMax >= 4 ? 4 : 2)>::Run(p, max_seq_len, ws_bytes, ws,
                                                                   stream, need);
  }
  if (p.pairs >= 2) {
    return GqaLauncher<KV, kQBf16, kDim, 2>::Run(p, max_seq_len, ws_bytes, ws, stream, need);
  }
  return GqaLauncher<KV, kQBf16, kDim, 1>::Run(p, max_seq_len, ws_bytes, ws, stream, need);
}

template <typename KV, bool kQBf16>
cudaError_t DispatchDim(int head_dim, GqaParams& p, int max_seq_len, size_t ws_bytes, void* ws,
                        cudaStream_t stream, size_t* need) {
  switch (head_dim) {
    case 64:
      return DispatchWarps<KV, kQBf16, 64>(p, max_seq_len, ws_bytes, ws, stream, need);
    case 128:
      return DispatchWarps<KV, kQBf16, 128>(p, max_seq_len, ws_bytes, ws, stream, need);
    case 256:
      return DispatchWarps<KV, kQBf16, 256>(p, max_seq_len, ws_bytes, ws, stream, need);
  }
  return cudaErrorInvalidValue;
}

bool Aligned16(int64_t v) { return (v & 15) == 0; }

}  // namespace

namespace {

// Validates, fills the parameters and dispatches; with `need` set, plans only.
cudaError_t GqaDispatch(const void* q, DType q_type, const void* kv_cache, DType kv_type,
                        const PagedKvLayout& layout, const int32_t* block_tables,
                        const int32_t* seq_lens, int max_seq_len, const GqaDecodeShape& shape,
                        const AttentionScales& scales, void* o, float* lse, void* workspace,
                        size_t workspace_bytes, cudaStream_t stream, size_t* need) {
  if (shape.batch <= 0) {
    if (need != nullptr) *need = detail::kCounterBytes;
    return cudaSuccess;
  }
  if (shape.num_kv_heads <= 0 || shape.num_qo_heads % shape.num_kv_heads != 0 ||
      shape.block_size <= 0 || shape.block_size % 16 != 0 || max_seq_len < 0 ||
      (workspace == nullptr && need == nullptr)) {
    return cudaErrorInvalidValue;
  }
  if (q_type == DType::kFP8E4M3) return cudaErrorInvalidValue;
  if (kv_type != q_type && kv_type != DType::kFP8E4M3) return cudaErrorInvalidValue;
  const int eb = DTypeBytes(kv_type);
  GqaParams p{};
  p.q = q;
  p.kv = static_cast<const uint8_t*>(kv_cache);
  p.v_offset = layout.v_offset * eb;
  p.block_stride = layout.block_stride * eb;
  p.token_stride = layout.token_stride * eb;
  p.head_stride = layout.head_stride * eb;
  if (!Aligned16(reinterpret_cast<int64_t>(kv_cache)) || !Aligned16(p.v_offset) ||
      !Aligned16(p.block_stride) || !Aligned16(p.token_stride) || !Aligned16(p.head_stride) ||
      !Aligned16(reinterpret_cast<int64_t>(q))) {
    return cudaErrorInvalidValue;
  }
  p.block_tables = block_tables;
  p.seq_lens = seq_lens;
  p.o = o;
  p.lse = lse;
  p.batch = shape.batch;
  p.num_qo_heads = shape.num_qo_heads;
  p.num_kv_heads = shape.num_kv_heads;
  p.group = shape.num_qo_heads / shape.num_kv_heads;
  p.qchunks = (p.group + 7) / 8;
  p.pairs = p.num_kv_heads * p.qchunks;
  p.block_size = shape.block_size;
  p.max_blocks_per_seq = shape.max_blocks_per_seq;
  p.scale_log2 = scales.sm_scale * scales.k_scale * detail::kLog2e;
  p.v_scale = scales.v_scale;
  max_seq_len = std::max(max_seq_len, 1);
  const int d = shape.head_dim;
  const size_t wb = workspace_bytes;
  switch (kv_type) {
    case DType::kBF16:
      return DispatchDim<Bf16Tag, true>(d, p, max_seq_len, wb, workspace, stream, need);
    case DType::kFP16:
      return DispatchDim<Fp16Tag, false>(d, p, max_seq_len, wb, workspace, stream, need);
    case DType::kFP8E4M3:
      if (q_type == DType::kBF16) {
        return DispatchDim<Fp8Tag, true>(d, p, max_seq_len, wb, workspace, stream, need);
      }
      return DispatchDim<Fp8Tag, false>(d, p, max_seq_len, wb, workspace, stream, need);
  }
  return cudaErrorInvalidValue;
}

}  // namespace

size_t GqaDecodeWorkspaceBytes(const GqaDecodeShape& shape, DType q_type, DType kv_type,
                               int max_seq_len) {
  size_t need = 0;
  const PagedKvLayout layout{};
  const AttentionScales scales{};
  if (GqaDispatch(nullptr, q_type, nullptr, kv_type, layout, nullptr, nullptr, max_seq_len, shape,
                  scales, nullptr, nullptr, nullptr, 0, nullptr, &need) != cudaSuccess) {
    return 0;
  }
  return need;
}

cudaError_t GqaDecode(const void* q, DType q_type, const void* kv_cache, DType kv_type,
                      const PagedKvLayout& layout, const int32_t* block_tables,
                      const int32_t* seq_lens, int max_seq_len, const GqaDecodeShape& shape,
                      const AttentionScales& scales, void* o, float* lse, void* workspace,
                      size_t workspace_bytes, cudaStream_t stream) {
  return GqaDispatch(q, q_type, kv_cache, kv_type, layout, block_tables, seq_lens, max_seq_len,
                     shape, scales, o, lse, workspace, workspace_bytes, stream, nullptr);
}

}  // namespace kvpool::kernels
