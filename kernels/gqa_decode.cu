#include "kernels/gqa_decode.cuh"

#include <algorithm>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels/cuda_common.cuh"
#include "kernels/decode_common.cuh"

// Design (docs/kernels.md has the long form):
//  - A work item is (sequence, group of kWarps (kv head, <= 8 query heads) pairs, tokens
//    [start, end)). PlanGqaDecode cuts the batch on the host from the real lengths
//    (decode_plan.h: every sequence into equal parts of at most one chunk, the chunk of least
//    modelled finish time under longest-first list scheduling, about 5 us per item beyond its
//    bytes) and writes the items into the workspace. When they fit the resident blocks, block i
//    takes item i (no work counter, no memset); otherwise persistent blocks take them, longest
//    first, from an atomic counter. One warp per kv head: the warps of a block stream the
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
//  - Items of a split sequence write partial results (slot of the plan) that
//    MergePartialsKernel combines, many warps per long sequence. (An earlier version merged
//    inside thread block clusters; it measured no faster and did not fit ragged plans.)

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
  detail::PlanWorkspace ws;
  int batch;
  int num_qo_heads;
  int num_kv_heads;
  int group;    // query heads per kv head
  int qchunks;  // groups of 8 (16 with kRows16) query heads per kv head
  int pairs;    // num_kv_heads * qchunks: one warp each
  int hgroups;  // ceil(pairs / warps per block)
  int block_size;
  int max_blocks_per_seq;
  int total_items;
  int chained;       // 1: block i takes item i, then items[i].next (SplitPlan::Chained); 0: counter
  float scale_log2;  // sm_scale * k_scale * log2(e)
  float v_scale;
};

constexpr unsigned kFull = 0xffffffffu;
constexpr int kSmemBudget = 200 * 1024;

// kMaxStages: ring depth per warp (4; 3 for the shallow variant of 1-warp blocks, which fits
// more blocks, hence more warps, on an SM).
template <typename KV, int kDim, int kWarps, int kMaxStages = 4>
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
  static constexpr int kStages = kFit > kMaxStages ? kMaxStages : kFit;
  // Rows of at least 128 bytes are copied warp-wide in whole 16-byte chunks, row after row, so
  // each copy instruction asks L2 for whole 128-byte lines (two 256-byte rows per instruction
  // for d128 bf16), into row-major tiles whose 16-byte chunks are XOR-swizzled (Swizzle()) so
  // that the fragment loads below hit distinct banks. 64-byte rows (e4m3, d64) keep a
  // thread-private layout: each thread copies exactly the pieces it reads.
  static constexpr bool kRowMajor = kRow >= 128;
  static constexpr int kChunksPerRow = kRow / 16;
  static_assert(kNKC >= 1 && kNVC >= 1 && kChunksPerRow >= 4, "head_dim too small");
};

// Shared memory of one warp: its ring, or (several warps per pair) at least the partial result
// it hands to the pair's first warp at the end of an item: one float per lane per accumulator
// slot, plus its row max and sum.
template <typename C, bool kRows16, int kTileWarps>
struct GqaWarpSmem {
  static constexpr int kH = kRows16 ? 2 : 1;
  static constexpr int kPartBytes = kTileWarps == 1 ? 0 : (kH * C::kMTiles * 4 + 2 * kH) * 32 * 4;
  static constexpr int kRing = C::kStages * C::kStageBytes;
  static constexpr int kBytes = kRing > kPartBytes ? kRing : kPartBytes;
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

// kRows16: each warp takes 16 query heads of its kv head (the MMA's rows 8..15 too) instead of
// 8, for groups above 8: one K/V stream per 16 query heads, twice the score and output
// accumulators.
// kTileWarps: warps per (kv head, query rows) pair. Warp w of the block serves pair
// w % kWarps and takes every kTileWarps-th 16-token tile of the item, from tile w / kWarps,
// through its own ring; at the end of the item the pair's warps merge their (max, sum,
// accumulator) through shared memory (their rings, then idle) and the first writes the result.
// More warps, hence more independent tile loops, per item and SM for the shapes with one or two
// kv heads per block.
template <typename KV, bool kQBf16, int kDim, int kWarps, bool kRows16, int kMaxStages,
          int kTileWarps = 1>
__global__ void __launch_bounds__(kWarps* kTileWarps * 32)
    GqaDecodeKernel(const __grid_constant__ GqaParams p) {
  using C = GqaConfig<KV, kDim, kWarps * kTileWarps, kMaxStages>;
  constexpr int kH = kRows16 ? 2 : 1;  // halves of 8 query rows per warp
  constexpr int kRows = 8 * kH;
  static_assert(C::kStages >= 2, "pipeline does not fit shared memory");
  constexpr int kWarpBytes = GqaWarpSmem<C, kRows16, kTileWarps>::kBytes;
  constexpr bool kFp8 = std::is_same_v<KV, Fp8Tag>;
  constexpr bool kMB = C::kMmaBf16;
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ int s_item;

  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int wpair = kTileWarps == 1 ? warp : warp % kWarps;  // pair of this block
  const int sub = kTileWarps == 1 ? 0 : warp / kWarps;       // first tile, of kTileWarps
  const int r = lane / 4;  // fragment row group
  const int qd = lane % 4;
  const uint32_t pipe = detail::SmemAddr(smem) + warp * kWarpBytes;
  detail::LaunchDependents();  // the merge kernel may be scheduled now; it waits for our end

  int item = -1;
  for (int round = 0;; ++round) {
    if (p.chained) {
      // Block i takes item i, then its chain (no counter, no barrier).
      item = round == 0 ? static_cast<int>(blockIdx.x) : __ldg(&p.ws.items[item].next);
      if (item < 0) break;
    } else {
      if (threadIdx.x == 0) s_item = atomicAdd(p.ws.counter, 1);
      __syncthreads();
      item = s_item;
      __syncthreads();
      if (item >= p.total_items) {
        if (threadIdx.x == 0) detail::FinishWorkCounter(p.ws.counter);
        break;
      }
    }
    const int4 wi = *reinterpret_cast<const int4*>(p.ws.items + item);  // seq, unit, start, end
    const int b = wi.x;
    const int pair = wi.y * kWarps + wpair;
    // Idle warps of the last head group: every warp of the pair is idle (the pair's barriers
    // below count only its warps).
    if (pair >= p.pairs) continue;
    const int len = p.seq_lens[b];
    const int h = pair / p.qchunks;
    const int g0 = (pair % p.qchunks) * kRows;
    const int grows = min(kRows, p.group - g0);
    const int head0 = h * p.group + g0;  // first query head of this warp
    const int start = wi.z;
    const int end = max(start, min(len, wi.w));

    // Query fragments (A of S = Q K^T): row r + 8 hf = query head head0 + r + 8 hf; rows
    // 8..15 are zero unless kRows16.
    uint32_t qlo[kH][C::kKSteps], qhi[kH][C::kKSteps];
#pragma unroll
    for (int hf = 0; hf < kH; ++hf) {
      const int row = r + 8 * hf;
      const uint4* qrow = reinterpret_cast<const uint4*>(
          static_cast<const uint16_t*>(p.q) +
          (size_t{1} * b * p.num_qo_heads + head0 + row) * kDim);
#pragma unroll
      for (int i = 0; i < C::kNKC; ++i) {
        // Piece i of this thread covers elements [kEK * (qd + 4i), +kEK).
        constexpr int kQVecs = C::kEK / 8;  // 16-byte vectors of the query per piece
#pragma unroll
        for (int v = 0; v < kQVecs; ++v) {
          uint4 x = make_uint4(0, 0, 0, 0);
          if (row < grows) x = qrow[(C::kEK * (qd + 4 * i)) / 8 + v];
          const uint32_t w[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
          for (int m2 = 0; m2 < 2; ++m2) {
            const int ks = i * (C::kEK / 4) + v * 2 + m2;  // 4 elements per k-step and thread
            qlo[hf][ks] = detail::ConvertPair<kQBf16, kMB>(w[2 * m2]);
            qhi[hf][ks] = detail::ConvertPair<kQBf16, kMB>(w[2 * m2 + 1]);
          }
        }
      }
    }
    // The A operand's rows 8..15 (registers a1, a3).
    auto q8lo = [&](int ks) -> uint32_t {
      if constexpr (kRows16) {
        return qlo[kH - 1][ks];
      } else {
        return 0u;
      }
    };
    auto q8hi = [&](int ks) -> uint32_t {
      if constexpr (kRows16) {
        return qhi[kH - 1][ks];
      } else {
        return 0u;
      }
    };

    // This warp's tiles of the item: local tile k is the item's tile sub + k * kTileWarps.
    const int ntiles = ((end - start + 15) / 16 - sub + kTileWarps - 1) / kTileWarps;
    const int32_t* table = p.block_tables + size_t{1} * b * p.max_blocks_per_seq;
    auto tile_tok0 = [&](int k) { return start + 16 * (sub + k * kTileWarps); };
    // Lane i holds the physical block of local tile k0 + i.
    auto load_blocks = [&](int k0) {
      const int k = k0 + lane;
      return k < ntiles ? __ldg(table + tile_tok0(k) / p.block_size) : 0;
    };
    int blocks = load_blocks(0);
    const uint8_t* head_base = p.kv + h * p.head_stride;

    auto issue = [&](int k) {
      if (k > 0 && (k & 31) == 0) blocks = load_blocks(k);
      const int blk = __shfl_sync(kFull, blocks, k & 31);
      const int tok0 = tile_tok0(k);
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

    float m_run[kH], l_run[kH];  // row r + 8 hf: running max (log2 domain), this thread's sum
    float acc[kH][C::kMTiles][4];
#pragma unroll
    for (int hf = 0; hf < kH; ++hf) {
      m_run[hf] = -INFINITY;
      l_run[hf] = 0.0f;
#pragma unroll
      for (int i = 0; i < C::kMTiles; ++i) {
        acc[hf][i][0] = acc[hf][i][1] = acc[hf][i][2] = acc[hf][i][3] = 0.0f;
      }
    }

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
      const int tok0 = tile_tok0(k);

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
              detail::Mma16816<kMB>(s[n], qlo[0][ks], q8lo(ks), qhi[0][ks], q8hi(ks), pr[2 * m],
                                    pr[2 * m + 1]);
            }
          } else {
            detail::Mma16816<kMB>(s[n], qlo[0][2 * i], q8lo(2 * i), qhi[0][2 * i], q8hi(2 * i),
                                  x.x, x.y);
            detail::Mma16816<kMB>(s[n], qlo[0][2 * i + 1], q8lo(2 * i + 1), qhi[0][2 * i + 1],
                                  q8hi(2 * i + 1), x.z, x.w);
          }
        }
      }

      // Online softmax over rows r + 8 hf (columns: tokens 8n + 2qd + e; the score fragment's
      // slots 2 hf + e).
      uint32_t pb0[kH], pb1[kH];
#pragma unroll
      for (int hf = 0; hf < kH; ++hf) {
        float sv[2][2];
        float mx = -INFINITY;
#pragma unroll
        for (int n = 0; n < 2; ++n) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const bool ok = tok0 + 8 * n + 2 * qd + e < end;
            sv[n][e] = ok ? s[n][2 * hf + e] * p.scale_log2 : -INFINITY;
            mx = fmaxf(mx, sv[n][e]);
          }
        }
        mx = fmaxf(mx, __shfl_xor_sync(kFull, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(kFull, mx, 2));
        const float m_new = fmaxf(m_run[hf], mx);  // finite: token 0 of a tile is always valid
        const float alpha = exp2f(m_run[hf] - m_new);
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
        l_run[hf] = l_run[hf] * alpha + psum;
        m_run[hf] = m_new;
        // Output columns are query rows 2qd and 2qd + 1 (of this half): their factors live in
        // lanes 8qd, 8qd+4.
        const float a0 = __shfl_sync(kFull, alpha, 8 * qd);
        const float a1 = __shfl_sync(kFull, alpha, 8 * qd + 4);
#pragma unroll
        for (int i = 0; i < C::kMTiles; ++i) {
          acc[hf][i][0] *= a0;
          acc[hf][i][1] *= a1;
          acc[hf][i][2] *= a0;
          acc[hf][i][3] *= a1;
        }
        pb0[hf] = detail::PackFloat2<kMB>(pv[0][0], pv[0][1]);
        pb1[hf] = detail::PackFloat2<kMB>(pv[1][0], pv[1][1]);
      }

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
          const uint32_t a0 = __byte_perm(x[0][pp], x[1][pp], 0x5410);
          const uint32_t a1 = __byte_perm(x[0][pp], x[1][pp], 0x7632);
          const uint32_t a2 = __byte_perm(x[2][pp], x[3][pp], 0x5410);
          const uint32_t a3 = __byte_perm(x[2][pp], x[3][pp], 0x7632);
#pragma unroll
          for (int hf = 0; hf < kH; ++hf) {
            detail::Mma16816<kMB>(acc[hf][mu], a0, a1, a2, a3, pb0[hf], pb1[hf]);
          }
        }
      }
    }

    if constexpr (kTileWarps > 1) {
      // Merge the pair's warps into the first (sub 0): each writes its row max, its sum and its
      // accumulators into its own shared memory (GqaWarpSmem; no copies are pending: the last
      // committed groups were empty or waited for), lane-major, then the first folds the
      // others in.
      detail::CpAsyncWait<0>();
      __syncwarp();
      float* part = reinterpret_cast<float*>(smem + warp * kWarpBytes);
      const int bar = 1 + wpair;  // named barrier of this pair (0 is __syncthreads)
      if (sub != 0) {
#pragma unroll
        for (int hf = 0; hf < kH; ++hf) {
          part[(2 * hf) * 32 + lane] = m_run[hf];
          part[(2 * hf + 1) * 32 + lane] = l_run[hf];
#pragma unroll
          for (int i = 0; i < C::kMTiles; ++i) {
#pragma unroll
            for (int c = 0; c < 4; ++c) {
              part[(2 * kH + (hf * C::kMTiles + i) * 4 + c) * 32 + lane] = acc[hf][i][c];
            }
          }
        }
      }
      detail::NamedBarrier(bar, kTileWarps * 32);
      if (sub == 0) {
#pragma unroll
        for (int j = 1; j < kTileWarps; ++j) {
          const float* other =
              reinterpret_cast<const float*>(smem + (warp + j * kWarps) * kWarpBytes);
#pragma unroll
          for (int hf = 0; hf < kH; ++hf) {
            const float m_o = other[(2 * hf) * 32 + lane];
            const float l_o = other[(2 * hf + 1) * 32 + lane];
            const float m_new = fmaxf(m_run[hf], m_o);
            // Both -inf (neither warp saw a token of these rows): nothing to scale.
            const float f_self = m_new == -INFINITY ? 0.0f : exp2f(m_run[hf] - m_new);
            const float f_o = m_new == -INFINITY ? 0.0f : exp2f(m_o - m_new);
            l_run[hf] = l_run[hf] * f_self + l_o * f_o;
            m_run[hf] = m_new;
            // Output columns 2qd, 2qd + 1: their rows' factors live in lanes 8qd, 8qd + 4.
            const float s0 = __shfl_sync(kFull, f_self, 8 * qd);
            const float s1 = __shfl_sync(kFull, f_self, 8 * qd + 4);
            const float o0 = __shfl_sync(kFull, f_o, 8 * qd);
            const float o1 = __shfl_sync(kFull, f_o, 8 * qd + 4);
#pragma unroll
            for (int i = 0; i < C::kMTiles; ++i) {
              const float* oa = other + (2 * kH + (hf * C::kMTiles + i) * 4) * 32 + lane;
              acc[hf][i][0] = acc[hf][i][0] * s0 + oa[0] * o0;
              acc[hf][i][1] = acc[hf][i][1] * s1 + oa[32] * o1;
              acc[hf][i][2] = acc[hf][i][2] * s0 + oa[64] * o0;
              acc[hf][i][3] = acc[hf][i][3] * s1 + oa[96] * o1;
            }
          }
        }
      }
      // The others refill their rings only after the first has read them.
      detail::NamedBarrier(bar, kTileWarps * 32);
      if (sub != 0) continue;
    }

    // This warp's results, per half: row r's sum and max, then the output columns 2qd and
    // 2qd + 1 (query rows 8 hf + 2qd + col).
    const int slot = __ldg(&p.ws.items[item].slot);
    const bool direct = slot < 0;
#pragma unroll
    for (int hf = 0; hf < kH; ++hf) {
      float l = l_run[hf];
      l += __shfl_xor_sync(kFull, l, 1);
      l += __shfl_xor_sync(kFull, l, 2);
      const float inv_row = l > 0.0f ? p.v_scale / l : 0.0f;
      const float lse_row = l > 0.0f ? (m_run[hf] + __log2f(l)) * detail::kLn2 : -INFINITY;
      const float inv0 = __shfl_sync(kFull, inv_row, 8 * qd);
      const float inv1 = __shfl_sync(kFull, inv_row, 8 * qd + 4);
#pragma unroll
      for (int col = 0; col < 2; ++col) {
        const int g = 8 * hf + 2 * qd + col;
        if (g >= grows) continue;
        const float inv = col ? inv1 : inv0;
        const size_t out_row = direct ? size_t{1} * b * p.num_qo_heads + head0 + g
                                      : size_t{1} * slot * p.num_qo_heads + head0 + g;
#pragma unroll
        for (int mu = 0; mu < C::kMTiles; ++mu) {
          // Slots 2mu (c0/c1) and 2mu+1 (c2/c3) are adjacent head_dim elements.
          const int d = C::kEV * (r + 8 * ((2 * mu) / C::kEV)) + (2 * mu) % C::kEV;
          const float v0 = acc[hf][mu][col] * inv, v1 = acc[hf][mu][2 + col] * inv;
          if (direct) {
            static_cast<uint32_t*>(p.o)[(out_row * kDim + d) / 2] =
                detail::PackFloat2<kQBf16>(v0, v1);
          } else {
            *reinterpret_cast<float2*>(p.ws.part_o + out_row * kDim + d) = make_float2(v0, v1);
          }
        }
      }
      const int row = 8 * hf + r;
      if (qd == 0 && row < grows) {
        if (direct) {
          if (p.lse != nullptr) p.lse[size_t{1} * b * p.num_qo_heads + head0 + row] = lse_row;
        } else {
          p.ws.part_lse[size_t{1} * slot * p.num_qo_heads + head0 + row] = lse_row;
        }
      }
    }
  }
}

// Largest warps per block the kernel supports for this type and head_dim.
template <typename KV, int kDim>
constexpr bool WarpsFit(int warps) {
  return warps == 1 || warps == 2 || ((warps == 4 || warps == 8) && warps <= MaxWarps<KV, kDim>());
}

constexpr double kReadBytesPerUs = 4.6e6;  // the H200's read ceiling, for the cost model

// Ring depth of the kernels with 2 and 4 warps per pair (index: warps per pair): with d128 bf16
// 2 x 4 and 4 x 2 stages of 8 KiB, 64 KiB per block: 3 blocks, 6 or 12 warps per SM (1-warp
// blocks: 6 blocks of 32 KiB).
constexpr int kTileWarpStages[5] = {0, 4, 4, 0, 2};

template <typename KV, bool kQBf16, int kDim, int kWarps, bool kRows16, int kMaxStages,
          int kTileWarps>
struct GqaLauncher {
  using C = GqaConfig<KV, kDim, kWarps * kTileWarps, kMaxStages>;
  static constexpr int kThreads = kWarps * kTileWarps * 32;
  static constexpr int kSmemBytes =
      kWarps * kTileWarps * GqaWarpSmem<C, kRows16, kTileWarps>::kBytes;

  // Resident thread blocks for the whole GPU (0 on error).
  static int ResidentCtas() {
    static const int ctas = [] {
      auto kernel = GqaDecodeKernel<KV, kQBf16, kDim, kWarps, kRows16, kMaxStages, kTileWarps>;
      if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes) !=
          cudaSuccess) {
        return 0;
      }
      int per_sm = 0;
      if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, kSmemBytes) !=
          cudaSuccess) {
        return 0;
      }
      return per_sm * detail::NumSms();
    }();
    return ctas;
  }

  // The planner's cost of one 16-token tile of one item (of all its pairs) while every
  // resident block streams.
  static double TileUs(int ctas) {
    return 16.0 * kWarps * 2 * kDim * C::kEB * ctas / kReadBytesPerUs;
  }

  static cudaError_t Run(const GqaDecodePlan& plan, GqaParams p, cudaStream_t stream) {
    p.ws = detail::CarvePlanWorkspace(const_cast<void*>(plan.workspace), plan.layout);
    p.total_items = static_cast<int>(plan.split.items.size());
    p.chained = plan.split.Chained() ? 1 : 0;  // otherwise the counter is zero (it resets itself)
    GqaDecodeKernel<KV, kQBf16, kDim, kWarps, kRows16, kMaxStages, kTileWarps>
        <<<plan.split.grid, kThreads, kSmemBytes, stream>>>(p);
    if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
    return detail::LaunchMergePartials<kQBf16, kDim>(
        p.ws, static_cast<int>(plan.split.merges.size()), plan.split.max_splits, p.num_qo_heads,
        p.o, p.lse, !plan.plain_merge, stream);
  }
};

template <int kV>
using Int = std::integral_constant<int, kV>;
template <bool kV>
using Bool = std::integral_constant<bool, kV>;

// Calls f(KV{}, Bool<kQBf16>{}, Int<kDim>{}, Int<kWarps>{}, Bool<kRows16>{}, Int<kMaxStages>{},
// Int<kTileWarps>{}) for the kernel of these types, head_dim, pairs per block, rows per warp,
// ring depth and warps per pair; false where there is none (16 rows per warp exist for head_dim
// <= 128 and up to 4 pairs per block; 3-stage rings for 1-warp blocks of 16-bit caches with
// head_dim <= 128; 2 or 4 warps per pair for blocks of one pair, 2 with 4-stage rings, 4 with
// 2-stage rings, kTileWarpStages).
template <typename F>
bool WithKernel(DType q_type, DType kv_type, int head_dim, int warps, bool rows16, int stages,
                int tile_warps, F&& f) {
  auto by_warps = [&](auto kv, auto qbf16, auto dim) {
    using KV = decltype(kv);
    constexpr int kDim = decltype(dim)::value;
    if (!WarpsFit<KV, kDim>(warps)) return false;
    auto with_stages = [&](auto w, auto r16) {
      if (tile_warps != 1) {
        if constexpr (decltype(w)::value == 1) {
          if (tile_warps == 2 && (stages == 0 || stages == kTileWarpStages[2])) {
            f(kv, qbf16, dim, w, r16, Int<kTileWarpStages[2]>{}, Int<2>{});
            return true;
          }
          if (tile_warps == 4 && (stages == 0 || stages == kTileWarpStages[4])) {
            f(kv, qbf16, dim, w, r16, Int<kTileWarpStages[4]>{}, Int<4>{});
            return true;
          }
        }
        return false;
      }
      if (stages == 0 || stages == 4) {
        f(kv, qbf16, dim, w, r16, Int<4>{}, Int<1>{});
        return true;
      }
      if constexpr (decltype(w)::value == 1 && kDim <= 128 && !std::is_same_v<KV, Fp8Tag>) {
        if (stages == 3) {
          f(kv, qbf16, dim, w, r16, Int<3>{}, Int<1>{});
          return true;
        }
      }
      return false;
    };
    auto call = [&](auto w) {
      if (rows16) {
        if constexpr (kDim <= 128 && decltype(w)::value <= 4) {
          return with_stages(w, Bool<true>{});
        }
        return false;
      }
      return with_stages(w, Bool<false>{});
    };
    switch (warps) {
      case 1:
        return call(Int<1>{});
      case 2:
        return call(Int<2>{});
      case 4:
        if constexpr (MaxWarps<KV, kDim>() >= 4) return call(Int<4>{});
        return false;
      case 8:
        if constexpr (MaxWarps<KV, kDim>() >= 8) return call(Int<8>{});
        return false;
    }
    return false;
  };
  auto by_dim = [&](auto kv, auto qbf16) {
    switch (head_dim) {
      case 64:
        return by_warps(kv, qbf16, Int<64>{});
      case 128:
        return by_warps(kv, qbf16, Int<128>{});
      case 256:
        return by_warps(kv, qbf16, Int<256>{});
    }
    return false;
  };
  switch (kv_type) {
    case DType::kBF16:
      return q_type == DType::kBF16 && by_dim(Bf16Tag{}, Bool<true>{});
    case DType::kFP16:
      return q_type == DType::kFP16 && by_dim(Fp16Tag{}, Bool<false>{});
    case DType::kFP8E4M3:
      if (q_type == DType::kBF16) return by_dim(Fp8Tag{}, Bool<true>{});
      if (q_type == DType::kFP16) return by_dim(Fp8Tag{}, Bool<false>{});
      return false;
  }
  return false;
}

bool Aligned16(int64_t v) { return (v & 15) == 0; }

int MaxWarpsFor(DType kv_type, int head_dim) {
  const int row = head_dim * DTypeBytes(kv_type);  // bytes of one K or V row
  const int stage = 32 * row;
  return kSmemBudget / (8 * stage) >= 2 ? 8 : (kSmemBudget / (4 * stage) >= 2 ? 4 : 2);
}

// Warps per block: one per (kv head, query group) pair, four by default. With d128 bf16 that is
// one block per SM, each warp's ring 4 stages deep; eight heads per block measured the same or
// 2-3% faster at batch 128 (docs/benchmarks.md) and stays an option. Three pairs take one warp
// per block (each pair its own unit) rather than four warps with one idle.
int DefaultWarps(int pairs, DType kv_type, int head_dim) {
  const int max_warps = MaxWarpsFor(kv_type, head_dim);
  if (pairs == 3) return 1;
  if (pairs >= 4 && max_warps >= 4) return 4;
  return pairs >= 2 ? 2 : 1;
}

// Ring depth per warp: 4, but 3 for 1-warp blocks of 16 query heads per warp over a 16-bit
// cache (rows16 implies head_dim <= 128), which fits 9 blocks on an SM instead of 6: measured
// 8% faster on 48/3 heads, 64 x 512-8k, and the same on 16/1 (docs/benchmarks.md, variant rows
// "1 warp x 3 stages"); 1-warp blocks of 8 query heads measured the same or slower with 3.
int DefaultStages(int warps, bool rows16, DType kv_type) {
  return warps == 1 && rows16 && kv_type != DType::kFP8E4M3 ? 3 : 4;
}

// Warps per pair: 4 (each every 4th tile, 2-stage rings) for 1-warp blocks of 16 query heads
// per warp over a 16-bit cache (groups above 8 with an odd number of kv heads, e.g. 16/1, 48/3):
// on an H100 the same or 1-3% faster on 16/1 128 x 512-8k and 48/3 64 x 512-8k and 19% faster on
// 16/1 1 x 128k than 1-warp blocks with 3-stage rings (docs/benchmarks.md). 1 otherwise: with 8
// query heads per warp 2 or 4 warps measured 0-6% slower except on one long sequence.
int DefaultTileWarps(int warps, bool rows16, DType kv_type) {
  return warps == 1 && rows16 && kv_type != DType::kFP8E4M3 ? 4 : 1;
}

// Everything of a plan but the items: warps, resident blocks, the planner's input.
struct PlanBasis {
  int warps = 0;
  bool rows16 = false;
  int stages = 4;
  int tile_warps = 1;
  int hgroups = 0;
  SplitPlanInput in;
};

KernelStatus MakeBasis(const GqaDecodeShape& shape, DType q_type, DType kv_type,
                       const int32_t* host_seq_lens, int max_seq_len,
                       const GqaDecodeOptions& options, PlanBasis* basis) {
  if (KernelStatus st = GqaDecodeSupported(shape, q_type, kv_type); !st.ok()) return st;
  if (max_seq_len < 0) return KernelStatus::Refused("max_seq_len is negative");
  const int group = shape.num_qo_heads / shape.num_kv_heads;
  // Groups above 8 take 16 query heads per warp (one K/V stream per 16 heads) where that kernel
  // exists.
  const bool rows16 =
      group > 8 && shape.head_dim <= 128 && !options.rows8 && options.warps != 8;
  const int rows = rows16 ? 16 : 8;
  const int pairs = shape.num_kv_heads * ((group + rows - 1) / rows);
  // (A ring depth asked for names a kernel of one warp per pair.)
  const int tile_warps =
      options.tile_warps != 0 ? options.tile_warps
      : options.stages != 0
          ? 1
          : DefaultTileWarps(
                options.warps != 0 ? options.warps : DefaultWarps(pairs, kv_type, shape.head_dim),
                rows16, kv_type);
  // Several warps per pair: one pair per block (each pair its own unit).
  const int warps = options.warps != 0 ? options.warps
                    : tile_warps > 1   ? 1
                                       : DefaultWarps(pairs, kv_type, shape.head_dim);
  if (tile_warps != 1 && tile_warps != 2 && tile_warps != 4) {
    return KernelStatus::Refused("GqaDecode: " + std::to_string(tile_warps) +
                                 " warps per kv head: 1, 2 or 4");
  }
  if (tile_warps > 1 && warps != 1) {
    return KernelStatus::Refused("GqaDecode: " + std::to_string(tile_warps) +
                                 " warps per kv head need blocks of one kv head (here " +
                                 std::to_string(warps) + ")");
  }
  int ctas = 0;
  double tile_us = 0.0;
  // The ring depth first: the resident blocks and the tile cost below are that kernel's.
  const int stages = options.stages != 0 ? options.stages
                     : tile_warps > 1    ? kTileWarpStages[tile_warps]
                                         : DefaultStages(warps, rows16, kv_type);
  const bool found =
      WithKernel(q_type, kv_type, shape.head_dim, warps, rows16, stages, tile_warps,
                 [&](auto kv, auto qbf16, auto dim, auto w, auto r16, auto st, auto tw) {
                   using L = GqaLauncher<decltype(kv), decltype(qbf16)::value, decltype(dim)::value,
                                         decltype(w)::value, decltype(r16)::value,
                                         decltype(st)::value, decltype(tw)::value>;
                   ctas = L::ResidentCtas();
                   tile_us = L::TileUs(ctas);
                 });
  if (!found && tile_warps > 1) {
    return KernelStatus::Refused("GqaDecode: " + std::to_string(tile_warps) +
                                 " warps per kv head run with " +
                                 std::to_string(kTileWarpStages[tile_warps]) +
                                 "-stage rings only (asked for " + std::to_string(stages) + ")");
  }
  if (!found && stages != 4) {
    return KernelStatus::Refused("GqaDecode: a ring of " + std::to_string(stages) +
                                 " stages exists only for 1-warp blocks of bf16/fp16 caches with "
                                 "head_dim <= 128 (here " + std::to_string(warps) +
                                 " warps, head_dim " + std::to_string(shape.head_dim) + ")");
  }
  if (!found) {
    return KernelStatus::Refused("GqaDecode: " + std::to_string(warps) +
                                 " warps per block do not fit head_dim " +
                                 std::to_string(shape.head_dim) + " of this type (at most " +
                                 std::to_string(MaxWarpsFor(kv_type, shape.head_dim)) + ")");
  }
  if (ctas <= 0) {
    const cudaError_t e = cudaGetLastError();
    return {static_cast<int>(e == cudaSuccess ? cudaErrorInvalidConfiguration : e),
            std::string("GqaDecode: the kernel cannot run on this device (") +
                cudaGetErrorString(e) + ")"};
  }
  basis->warps = warps;
  basis->rows16 = rows16;
  basis->stages = stages;
  basis->tile_warps = tile_warps;
  basis->hgroups = (pairs + warps - 1) / warps;
  SplitPlanInput& in = basis->in;
  in.batch = shape.batch;
  in.units_per_seq = basis->hgroups;
  in.seq_lens = host_seq_lens;
  in.max_seq_len = std::max(max_seq_len, 1);
  in.ctas = ctas;
  in.granule = 16;
  in.min_chunk = 128;
  in.granule_us = tile_us;
  in.item_us = 5.0;
  in.merge_us = 4.0;
  in.counter_us = 0.5;  // the atomic takes (the counter resets itself, no memset)
  in.max_slots = 2 * ctas * tile_warps;
  in.forced_chunk = options.chunk;
  in.uniform = options.uniform;
  in.spans = options.spans || options.force_spans;
  in.force_spans = options.force_spans;
  return KernelStatus::Ok();
}

}  // namespace

KernelStatus GqaDecodeSupported(const GqaDecodeShape& shape, DType q_type, DType kv_type) {
  auto refuse = [](const std::string& why) { return KernelStatus::Refused("GqaDecode: " + why); };
  if (shape.batch < 0) return refuse("negative batch");
  if (shape.num_kv_heads <= 0 || shape.num_qo_heads <= 0 ||
      shape.num_qo_heads % shape.num_kv_heads != 0) {
    return refuse("num_qo_heads (" + std::to_string(shape.num_qo_heads) +
                  ") must be a positive multiple of num_kv_heads (" +
                  std::to_string(shape.num_kv_heads) + ")");
  }
  if (shape.head_dim != 64 && shape.head_dim != 128 && shape.head_dim != 256) {
    return refuse("head_dim " + std::to_string(shape.head_dim) + " is not 64, 128 or 256");
  }
  if (shape.block_size <= 0 || shape.block_size % 16 != 0) {
    return refuse("block_size " + std::to_string(shape.block_size) +
                  " is not a positive multiple of 16");
  }
  if (q_type == DType::kFP8E4M3) return refuse("queries cannot be e4m3 (bf16 or fp16)");
  if (kv_type != q_type && kv_type != DType::kFP8E4M3) {
    return refuse("the cache must have the query's type or be e4m3");
  }
  return KernelStatus::Ok();
}

size_t GqaDecodeWorkspaceBytes(const GqaDecodeShape& shape, DType q_type, DType kv_type,
                               int max_seq_len, const GqaDecodeOptions& options) {
  PlanBasis basis;
  if (!MakeBasis(shape, q_type, kv_type, nullptr, max_seq_len, options, &basis).ok()) return 0;
  return DecodeWorkspaceBytes(basis.in, shape.num_qo_heads, shape.head_dim);
}

KernelStatus PlanGqaDecode(const GqaDecodeShape& shape, DType q_type, DType kv_type,
                           const int32_t* host_seq_lens, int max_seq_len, void* workspace,
                           size_t workspace_bytes, cudaStream_t stream, GqaDecodePlan* plan,
                           const GqaDecodeOptions& options) {
  if (plan == nullptr) return KernelStatus::Refused("PlanGqaDecode: no plan to fill");
  *plan = GqaDecodePlan{};
  PlanBasis basis;
  if (KernelStatus st =
          MakeBasis(shape, q_type, kv_type, host_seq_lens, max_seq_len, options, &basis);
      !st.ok()) {
    return st;
  }
  if (workspace == nullptr) return KernelStatus::Refused("PlanGqaDecode: no workspace");
  SplitPlanInput& in = basis.in;
  if (KernelStatus st =
          PlanSplitsInWorkspace("PlanGqaDecode", &in, shape.num_qo_heads, shape.head_dim,
                                workspace_bytes, &plan->split, &plan->layout);
      !st.ok()) {
    return st;
  }
  plan->shape = shape;
  plan->q_type = q_type;
  plan->kv_type = kv_type;
  plan->max_seq_len = in.max_seq_len;
  plan->warps = basis.warps;
  plan->rows16 = basis.rows16;
  plan->stages = basis.stages;
  plan->tile_warps = basis.tile_warps;
  plan->plain_merge = options.plain_merge;
  plan->workspace = workspace;
  if (cudaError_t e = detail::UploadPlan(plan->split, plan->layout, workspace, stream);
      e != cudaSuccess) {
    return {static_cast<int>(e), std::string("PlanGqaDecode: ") + cudaGetErrorString(e)};
  }
  return KernelStatus::Ok();
}

KernelStatus RunGqaDecode(const GqaDecodePlan& plan, const void* q, const void* kv_cache,
                          const PagedKvLayout& layout, const int32_t* block_tables,
                          const int32_t* seq_lens, const AttentionScales& scales, void* o,
                          float* lse, cudaStream_t stream) {
  const GqaDecodeShape& shape = plan.shape;
  if (shape.batch == 0) return KernelStatus::Ok();
  if (plan.workspace == nullptr) return KernelStatus::Refused("RunGqaDecode: the plan is empty");
  const int eb = DTypeBytes(plan.kv_type);
  GqaParams p{};
  p.q = q;
  p.kv = static_cast<const uint8_t*>(kv_cache);
  p.v_offset = layout.v_offset * eb;
  p.block_stride = layout.block_stride * eb;
  p.token_stride = layout.token_stride * eb;
  p.head_stride = layout.head_stride * eb;
  if (!Aligned16(reinterpret_cast<int64_t>(kv_cache)) || !Aligned16(reinterpret_cast<int64_t>(q))) {
    return KernelStatus::Refused("RunGqaDecode: q and kv_cache must be 16-byte aligned");
  }
  if (!Aligned16(p.v_offset) || !Aligned16(p.block_stride) || !Aligned16(p.token_stride) ||
      !Aligned16(p.head_stride)) {
    return KernelStatus::Refused(
        "RunGqaDecode: every layout stride must be a multiple of 16 bytes");
  }
  p.block_tables = block_tables;
  p.seq_lens = seq_lens;
  p.o = o;
  p.lse = lse;
  p.batch = shape.batch;
  p.num_qo_heads = shape.num_qo_heads;
  p.num_kv_heads = shape.num_kv_heads;
  p.group = shape.num_qo_heads / shape.num_kv_heads;
  const int rows = plan.rows16 ? 16 : 8;
  p.qchunks = (p.group + rows - 1) / rows;
  p.pairs = p.num_kv_heads * p.qchunks;
  p.hgroups = (p.pairs + plan.warps - 1) / plan.warps;
  p.block_size = shape.block_size;
  p.max_blocks_per_seq = shape.max_blocks_per_seq;
  p.scale_log2 = scales.sm_scale * scales.k_scale * detail::kLog2e;
  p.v_scale = scales.v_scale;
  cudaError_t e = cudaSuccess;
  const bool found = WithKernel(
      plan.q_type, plan.kv_type, shape.head_dim, plan.warps, plan.rows16, plan.stages,
      plan.tile_warps, [&](auto kv, auto qbf16, auto dim, auto w, auto r16, auto st, auto tw) {
        using L = GqaLauncher<decltype(kv), decltype(qbf16)::value, decltype(dim)::value,
                              decltype(w)::value, decltype(r16)::value, decltype(st)::value,
                              decltype(tw)::value>;
        e = L::Run(plan, p, stream);
      });
  if (!found) return KernelStatus::Refused("RunGqaDecode: the plan names no kernel");
  if (e != cudaSuccess) {
    return {static_cast<int>(e), std::string("RunGqaDecode: ") + cudaGetErrorString(e)};
  }
  return KernelStatus::Ok();
}

cudaError_t GqaDecode(const void* q, DType q_type, const void* kv_cache, DType kv_type,
                      const PagedKvLayout& layout, const int32_t* block_tables,
                      const int32_t* seq_lens, int max_seq_len, const GqaDecodeShape& shape,
                      const AttentionScales& scales, void* o, float* lse, void* workspace,
                      size_t workspace_bytes, cudaStream_t stream) {
  GqaDecodePlan plan;
  KernelStatus st = PlanGqaDecode(shape, q_type, kv_type, nullptr, max_seq_len, workspace,
                                  workspace_bytes, stream, &plan);
  if (st.ok()) {
    st = RunGqaDecode(plan, q, kv_cache, layout, block_tables, seq_lens, scales, o, lse, stream);
  }
  return static_cast<cudaError_t>(st.cuda_error);
}

}  // namespace kvpool::kernels
