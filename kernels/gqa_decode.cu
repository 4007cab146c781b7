#include "kernels/gqa_decode.cuh"

#include <algorithm>
#include <type_traits>

#include "kernels/cuda_common.cuh"
#include "kernels/decode_common.cuh"
#include "kernels/tuning.h"

// Design (docs/kernels.md has the long form):
//  - A work item is (sequence, group of kWarps (kv head, <= 8 query heads) pairs, chunk of
//    tokens); persistent thread blocks take items from an atomic counter, so ragged lengths
//    balance themselves. One warp per kv head: the warps of a block stream the same cache
//    blocks at the same pace, so together they read every block's rows whole (all heads of a
//    token are adjacent in the engines' layouts), which DRAM serves much better than the
//    256-byte pieces of one head.
//  - Each warp streams its 16-token tiles through a private shared-memory ring with cp.async:
//    every thread copies exactly the 16-byte pieces it later reads itself, so the pipeline
//    needs no barriers at all.
//  - Scores and outputs come from mma.sync m16n8k16: S = Q K^T with the query heads as the M
//    side (rows 8..15 unused), then O^T = V^T P^T with head_dim as the M side, so the score
//    fragment is already the P operand and no accumulator row is wasted. Which head_dim
//    element sits in which fragment slot is permuted so that every thread reads whole 16-byte
//    pieces of K and V rows; the query is loaded with the same permutation and the output is
//    un-permuted when it is written.
//  - Sequences longer than one chunk write partial results that MergeSplitsKernel combines.

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

  while (true) {
    if (threadIdx.x == 0) s_item = atomicAdd(p.ws.counter, 1);
    __syncthreads();
    const int item = s_item;
    __syncthreads();
    if (item >= p.total_items) break;
    int t = item;
    const int hg = t % p.hgroups;
    t /= p.hgroups;
    const int b = t % p.batch;
    const int split = t / p.batch;
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
}

// Tokens per work item: about 4 items per resident block, at least 256 tokens, and at most
// max_splits_cap splits per sequence (0: no cap).
int ChunkFor(int batch, int hgroups, int max_seq_len, int ctas, int max_splits_cap) {
  return detail::ChooseChunk(int64_t{batch} * hgroups, max_seq_len, ctas, /*granule=*/16,
                             /*min_chunk=*/256, /*waves=*/4, max_splits_cap);
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

  // With `need` set, only computes the workspace this call would use at most and stores it.
  static cudaError_t Run(GqaParams p, int max_seq_len, size_t workspace_bytes, void* workspace,
                         cudaStream_t stream, size_t* need) {
    const int ctas = ResidentCtas();
    if (ctas <= 0) return cudaErrorInvalidConfiguration;
    p.hgroups = (p.pairs + kWarps - 1) / kWarps;
    if (need != nullptr) {
      const int chunk = ChunkFor(p.batch, p.hgroups, max_seq_len, ctas, 0);
      *need = detail::SplitWorkspaceBytes(p.batch, detail::NumSplits(max_seq_len, chunk),
                                          p.num_qo_heads, kDim);
      return cudaSuccess;
    }
    if (workspace_bytes < detail::kCounterBytes) return cudaErrorInvalidValue;
    const int64_t per_split = int64_t{4} * p.batch * p.num_qo_heads * (kDim + 1);
    const int cap = static_cast<int>(std::clamp<int64_t>(
        (static_cast<int64_t>(workspace_bytes) - detail::kCounterBytes) / per_split, 1, 1 << 20));
    const int chunk = ChunkFor(p.batch, p.hgroups, max_seq_len, ctas, cap);
    p.chunk = chunk;
    p.max_splits = detail::NumSplits(max_seq_len, chunk);
    p.ws = detail::CarveSplitWorkspace(workspace, p.batch, p.max_splits, p.num_qo_heads);
    const int64_t items = int64_t{p.max_splits} * p.batch * p.hgroups;
    if (items > INT32_MAX) return cudaErrorInvalidValue;
    p.total_items = static_cast<int>(items);
    if (cudaError_t e = cudaMemsetAsync(p.ws.counter, 0, sizeof(int), stream); e != cudaSuccess) {
      return e;
    }
    const int grid = static_cast<int>(std::min<int64_t>(ctas, items));
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
// as eight heads per block or faster (kept as a benchmark variant, see docs/benchmarks.md).
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
