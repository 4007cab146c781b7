#include "kernels/mla_decode.cuh"

#include <cuda.h>  // CUtensorMap and its encoder's types (the encoder comes via cudart)
#include <cudaTypedefs.h>

#include <algorithm>
#include <type_traits>

#include "kernels/cuda_common.cuh"
#include "kernels/decode_common.cuh"
#include "kernels/tuning.h"

// Design (docs/kernels.md has the long form):
//  - A work item is (sequence, group of kN = 16 or 32 heads, chunk of tokens). One block per SM:
//    a producer warp takes items from an atomic counter and streams each item's rows into a
//    shared-memory ring of 32-token stages; four consumer warps compute. Stages carry the item
//    they belong to; "full" mbarriers (the producer's arrival plus the copied bytes) and
//    "empty" mbarriers (one arrival per consumer warp) hand them back and forth, so no
//    block-wide barrier is left.
//  - Copies: where the block size is a multiple of 16, tensor copies (TMA) of [32 or 16 rows]
//    x [64 elements] boxes, 9 or 18 per stage, into 64-element column slabs that the copy
//    engine swizzles (128-byte swizzle for 16-bit values, 64-byte for e4m3), which keeps the
//    fragment loads below conflict-free. Otherwise (and for e4m3 at 32 heads per block, whose
//    tensor-copy build spills registers) one bulk copy per row into padded rows. Rows past the
//    end of a sequence are zeroed (tensor copies) or copy its last token (row copies), so NaN
//    in unused cache slots never meets a probability.
//  - A softmax tile is 64 tokens (two stages). Scores are computed transposed, S^T = K Q^T,
//    with tokens as mma.sync's M side: consumer warp w covers tokens 16w .. 16w + 15 for all kN
//    heads over the whole 576-wide key (query fragments from shared memory), so no partial
//    scores are summed across warps. Per tile: each warp's per-head maxima go to shared memory
//    and one named barrier of the four consumer warps later every warp knows the tile's
//    maxima; P^T (16-bit) goes to shared memory and a second named barrier later warp w computes
//    O^T = V^T P^T for value dims 128w .. 128w + 127 (value dims as the M side). Row sums stay
//    per thread until the item ends.
//  - Processing 32 heads in one block reads every K/V byte from memory once per 32 heads.
//  - bf16/fp16 fragments come from ldmatrix; e4m3 fragments from 32-bit loads converted to
//    fp16 (exact), with the key dimensions permuted inside each k-step (the query is stored in
//    shared memory with the same permutation) and the value dimensions permuted inside each
//    32-wide group (undone when the output is written). Fragments are loaded one or two steps
//    ahead of their MMAs.
//  - The previous kernel (eight warps per 16 heads, scores split over key-dim quarters, four
//    block barriers per 32-token tile) stays as a benchmark variant (KernelTuning::mla_variant).

namespace kvpool::kernels {
namespace {

using detail::Bf16Tag;
using detail::Fp16Tag;
using detail::Fp8Tag;
using detail::KvTraits;

// ---------------------------------------------------------------------------------------------
// The previous kernel (a benchmark variant): eight warps per 16 heads, scores split over four
// key-dim quarters and summed in shared memory, four block barriers per 32-token tile.

constexpr int kTile = 32;                          // tokens per pipeline stage
constexpr int kGroupWarps = 8;                     // warps per group of 16 heads
constexpr int kKStepsPerWarp = kMlaKDim / 16 / 4;  // 9: key dims split four ways
constexpr int kVSlice = kMlaVDim / kGroupWarps;    // 64 value dims per warp
constexpr unsigned kFull = 0xffffffffu;

struct MlaParams {
  CUtensorMap kv_map;  // the cache as [num_blocks][block_size][576] for tensor copies
  int box_rows;        // rows per tensor copy: 32, or 16 for 16-token blocks
  const void* q;
  const uint8_t* kv;
  int64_t block_stride;  // bytes
  const int32_t* block_tables;
  const int32_t* seq_lens;
  void* o;
  float* lse;
  detail::SplitWorkspace ws;
  int batch;
  int num_heads;
  int hchunks;  // groups of 16 * kMT heads
  int block_size;
  int max_blocks_per_seq;
  int chunk;
  int max_splits;
  int total_items;
  float scale_log2;
  float v_scale;
};

template <typename KV, int kMT, bool kDeep = false>
struct MlaV1Config {
  static constexpr int kEB = KvTraits<KV>::kBytes;
  static constexpr bool kMmaBf16 = KvTraits<KV>::kMmaBf16;
  static constexpr int kRowBytes = kMlaKDim * kEB;
  // Row pitch in shared memory: 16-bit rows shift by 16 bytes (ldmatrix rows on distinct
  // banks), e4m3 rows by 4 words mod 32 (32-bit fragment loads on distinct banks).
  static constexpr int kPitch = kEB == 2 ? 1168 : 656;
  // Two blocks of 8 warps per SM for one head group, one block of 16 warps for two.
  // kDeep (one head group): one block per SM with a deeper ring instead.
  static constexpr int kStages =
      kEB == 2 ? (kMT == 1 ? (kDeep ? 5 : 2) : 4) : (kMT == 1 ? (kDeep ? 9 : 4) : 7);
  static constexpr int kStageBytes = kTile * kPitch;
  static constexpr int kSpartStride = kTile + 8;  // floats per partial-score row
  static constexpr int kSpartBytes = kMT * 4 * 16 * kSpartStride * 4;
  static constexpr int kPStride = kTile + 8;  // 16-bit values per P row (80 bytes)
  static constexpr int kPBytes = kMT * 16 * kPStride * 2;
  static constexpr int kStatBytes = kMT * kGroupWarps * 16 * 4;  // row maxima, row sums
  static constexpr int kSpartOffset = kStages * kStageBytes;
  static constexpr int kPOffset = kSpartOffset + kSpartBytes;
  static constexpr int kMaxOffset = kPOffset + kPBytes;
  static constexpr int kSumOffset = kMaxOffset + kStatBytes;
  static constexpr int kBarOffset = kSumOffset + kStatBytes;
  static constexpr int kSmemBytes = kBarOffset + 8 * kStages;
  static constexpr int kThreads = kMT * kGroupWarps * 32;
  static_assert(kBarOffset % 8 == 0, "mbarriers are 8-byte aligned");
};

__device__ __forceinline__ uint32_t Ld32(const uint16_t* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}

template <typename KV, bool kQBf16, int kMT, bool kDeep>
__global__ void __launch_bounds__(kMT* kGroupWarps * 32, 2 / kMT)
    MlaV1Kernel(const __grid_constant__ MlaParams p) {
  using C = MlaV1Config<KV, kMT, kDeep>;
  constexpr bool kFp8 = std::is_same_v<KV, Fp8Tag>;
  constexpr bool kMB = C::kMmaBf16;
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ int s_item;

  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int mt = warp / kGroupWarps;  // head group
  const int w = warp % kGroupWarps;
  const int dq = w % 4;  // key-dim quarter in S = Q K^T
  const int th = w / 4;  // token half in S = Q K^T
  const int r = lane / 4;
  const int qd = lane % 4;
  const int fh = lane / 2;  // finishing role: head fh, tokens 4w + 2 (lane % 2) + {0, 1}
  const int ft = 4 * w + 2 * (lane % 2);
  const int bar_id = 1 + mt;
  const uint32_t smem_base = detail::SmemAddr(smem);
  float* spart = reinterpret_cast<float*>(smem + C::kSpartOffset) + mt * 4 * 16 * C::kSpartStride;
  uint16_t* pbuf = reinterpret_cast<uint16_t*>(smem + C::kPOffset) + mt * 16 * C::kPStride;
  float* rowmax = reinterpret_cast<float*>(smem + C::kMaxOffset) + mt * kGroupWarps * 16;
  float* rowsum = reinterpret_cast<float*>(smem + C::kSumOffset) + mt * kGroupWarps * 16;
  const uint32_t bars = smem_base + C::kBarOffset;
  if (threadIdx.x == 0) {
    for (int s = 0; s < C::kStages; ++s) detail::MbarInit(bars + 8 * s, 1);
    detail::FenceBarrierInit();
  }
  __syncthreads();

  uint32_t it = 0;  // tiles this block has consumed so far (drives stages and parities)
  while (true) {
    if (threadIdx.x == 0) s_item = atomicAdd(p.ws.counter, 1);
    __syncthreads();
    const int item = s_item;
    __syncthreads();
    if (item >= p.total_items) break;
    int t = item;
    const int hc = t % p.hchunks;
    t /= p.hchunks;
    const int b = t % p.batch;
    const int split = t / p.batch;
    const int len = p.seq_lens[b];
    const int nsplit = max(1, (len + p.chunk - 1) / p.chunk);
    if (split >= nsplit) continue;
    const int start = split * p.chunk;
    const int end = min(len, start + p.chunk);
    const int ntiles = (end - start + kTile - 1) / kTile;
    const int head_base = (hc * kMT + mt) * 16;
    const int32_t* table = p.block_tables + size_t{1} * b * p.max_blocks_per_seq;

    // Query fragments for this warp's 9 k-steps; rows r and r + 8 are heads head_base + r, +8.
    uint32_t qa[kKStepsPerWarp][4];
    {
      const uint16_t* q0 = static_cast<const uint16_t*>(p.q) +
                           (size_t{1} * b * p.num_heads + head_base + r) * kMlaKDim;
      const uint16_t* q8 = q0 + 8 * kMlaKDim;
#pragma unroll
      for (int kk = 0; kk < kKStepsPerWarp; ++kk) {
        const int ks = dq * kKStepsPerWarp + kk;
        const int d0 = kFp8 ? 16 * ks + 4 * qd : 16 * ks + 2 * qd;
        const int hi = kFp8 ? 2 : 8;
        qa[kk][0] = detail::ConvertPair<kQBf16, kMB>(Ld32(q0 + d0));
        qa[kk][1] = detail::ConvertPair<kQBf16, kMB>(Ld32(q8 + d0));
        qa[kk][2] = detail::ConvertPair<kQBf16, kMB>(Ld32(q0 + d0 + hi));
        qa[kk][3] = detail::ConvertPair<kQBf16, kMB>(Ld32(q8 + d0 + hi));
      }
    }

    // Warp 0 loads tile k: lane j copies the row of token start + 32k + j (clamped to the
    // last token of the sequence). The block id of the next tile is fetched right after a tile
    // is issued, so its latency hides behind the compute of the tiles in between.
    auto block_of = [&](int k) {
      const int tok = min(start + k * kTile + lane, end - 1);
      return __ldg(table + tok / p.block_size);
    };
    auto issue = [&](int k, int blk) {
      const uint32_t g = it + k;
      const uint32_t stage = g % C::kStages;
      const uint32_t bar = bars + 8 * stage;
      detail::FenceProxyAsync();
      if (lane == 0) detail::MbarArriveExpectTx(bar, kTile * C::kRowBytes);
      __syncwarp();
      const int tok = min(start + k * kTile + lane, end - 1);
      const uint8_t* src = p.kv + blk * p.block_stride + int64_t{tok % p.block_size} * C::kRowBytes;
      detail::BulkCopyG2S(smem_base + stage * C::kStageBytes + lane * C::kPitch, src, C::kRowBytes,
                          bar);
    };
    int next_blk = 0;  // warp 0: block id of tile `issued`
    int issued = 0;
    auto issue_next = [&] {
      issue(issued, next_blk);
      ++issued;
      if (issued < ntiles) next_blk = block_of(issued);
    };
    if (warp == 0 && ntiles > 0) {
      next_blk = block_of(0);
      while (issued < min(C::kStages, ntiles)) issue_next();
    }

    float m_fin = -INFINITY;                 // running max of head fh (finishing role)
    float m_pv[2] = {-INFINITY, -INFINITY};  // running max of heads r, r + 8 (P V role)
    float l_pv[2] = {0.0f, 0.0f};
    float acc[8][4];
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;

    for (int k = 0; k < ntiles; ++k) {
      const uint32_t g = it + k;
      const uint32_t stage = g % C::kStages;
      detail::MbarWait(bars + 8 * stage, (g / C::kStages) & 1);
      const uint32_t kv_s = smem_base + stage * C::kStageBytes;
      const int tok0 = start + k * kTile;

      // 1. Partial scores: key dims of quarter dq, tokens 16 th .. 16 th + 15 (two n-tiles).
      // Even and odd k-steps accumulate separately: four independent MMA chains, not two.
      float s[2][4], s2[2][4];
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
        s2[j][0] = s2[j][1] = s2[j][2] = s2[j][3] = 0.0f;
      }
#pragma unroll
      for (int kk = 0; kk < kKStepsPerWarp; ++kk) {
        const int ks = dq * kKStepsPerWarp + kk;
        float(&sa)[2][4] = (kk & 1) ? s2 : s;
        if constexpr (kFp8) {
#pragma unroll
          for (int j = 0; j < 2; ++j) {
            const int row = 16 * th + 8 * j + r;
            const uint32_t x = detail::LdShared4(kv_s + row * C::kPitch + 16 * ks + 4 * qd);
            uint32_t lo, hi;
            detail::Fp8x4ToHalf2x2(x, lo, hi);
            detail::Mma16816<kMB>(sa[j], qa[kk][0], qa[kk][1], qa[kk][2], qa[kk][3], lo, hi);
          }
        } else {
          const int mat = lane / 8;
          const int row = 16 * th + 8 * (mat >> 1) + lane % 8;
          const int col = 16 * ks + 8 * (mat & 1);
          uint32_t b0, b1, b2, b3;
          detail::LdMatrixX4(kv_s + row * C::kPitch + col * 2, b0, b1, b2, b3);
          detail::Mma16816<kMB>(sa[0], qa[kk][0], qa[kk][1], qa[kk][2], qa[kk][3], b0, b1);
          detail::Mma16816<kMB>(sa[1], qa[kk][0], qa[kk][1], qa[kk][2], qa[kk][3], b2, b3);
        }
      }
#pragma unroll
      for (int j = 0; j < 2; ++j) {
#pragma unroll
        for (int c = 0; c < 4; ++c) s[j][c] += s2[j][c];
      }
      {
        float* my_part = spart + dq * 16 * C::kSpartStride;
#pragma unroll
        for (int j = 0; j < 2; ++j) {
#pragma unroll
          for (int hf = 0; hf < 2; ++hf) {
            *reinterpret_cast<float2*>(my_part + (r + 8 * hf) * C::kSpartStride + 16 * th + 8 * j +
                                       2 * qd) = make_float2(s[j][2 * hf], s[j][2 * hf + 1]);
          }
        }
      }
      detail::NamedBarrier(bar_id, kGroupWarps * 32);

      // 2. Finish tokens ft, ft + 1 of head fh: sum the quarters, scale, mask, tile maxima.
      float2 sc = make_float2(0.0f, 0.0f);
#pragma unroll
      for (int qq = 0; qq < 4; ++qq) {
        const float2 v =
            *reinterpret_cast<const float2*>(spart + (qq * 16 + fh) * C::kSpartStride + ft);
        sc.x += v.x;
        sc.y += v.y;
      }
      sc.x = tok0 + ft < end ? sc.x * p.scale_log2 : -INFINITY;
      sc.y = tok0 + ft + 1 < end ? sc.y * p.scale_log2 : -INFINITY;
      float fmx = fmaxf(sc.x, sc.y);
      fmx = fmaxf(fmx, __shfl_xor_sync(kFull, fmx, 1));
      if ((lane & 1) == 0) rowmax[w * 16 + fh] = fmx;
      detail::NamedBarrier(bar_id, kGroupWarps * 32);

      // 3. New maxima (identical in every warp); P and row sums of the finishing role.
      float tmax = -INFINITY, tmax_pv[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int ww = 0; ww < kGroupWarps; ++ww) {
        tmax = fmaxf(tmax, rowmax[ww * 16 + fh]);
        tmax_pv[0] = fmaxf(tmax_pv[0], rowmax[ww * 16 + r]);
        tmax_pv[1] = fmaxf(tmax_pv[1], rowmax[ww * 16 + r + 8]);
      }
      m_fin = fmaxf(m_fin, tmax);  // finite: token 0 of a tile is always valid
      const float p0 = exp2f(sc.x - m_fin), p1 = exp2f(sc.y - m_fin);
      *reinterpret_cast<uint32_t*>(pbuf + fh * C::kPStride + ft) = detail::PackFloat2<kMB>(p0, p1);
      float fsum = p0 + p1;
      fsum += __shfl_xor_sync(kFull, fsum, 1);
      if ((lane & 1) == 0) rowsum[w * 16 + fh] = fsum;
      float alpha[2];
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const float m_new = fmaxf(m_pv[hf], tmax_pv[hf]);
        alpha[hf] = exp2f(m_pv[hf] - m_new);
        m_pv[hf] = m_new;
      }
      detail::NamedBarrier(bar_id, kGroupWarps * 32);

      // 4. O = O * alpha + P V over this warp's 64 value dims.
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        float sum = 0.0f;
#pragma unroll
        for (int ww = 0; ww < kGroupWarps; ++ww) sum += rowsum[ww * 16 + r + 8 * hf];
        l_pv[hf] = l_pv[hf] * alpha[hf] + sum;
      }
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        acc[i][0] *= alpha[0];
        acc[i][1] *= alpha[0];
        acc[i][2] *= alpha[1];
        acc[i][3] *= alpha[1];
      }
      const int slice = w * kVSlice;
#pragma unroll
      for (int kk = 0; kk < 2; ++kk) {
        uint32_t pa[4];
        {
          const int mat = lane / 8;
          const int prow = 8 * (mat & 1) + lane % 8;
          const int pcol = 16 * kk + 8 * (mat >> 1);
          detail::LdMatrixX4(detail::SmemAddr(pbuf + prow * C::kPStride + pcol), pa[0], pa[1],
                             pa[2], pa[3]);
        }
        if constexpr (kFp8) {
          const int t0 = 16 * kk + 2 * qd;
#pragma unroll
          for (int gm = 0; gm < 2; ++gm) {
            const uint32_t off = kv_s + slice + 32 * gm + 4 * r;
            uint32_t lo[4], hi[4];
            detail::Fp8x4ToHalf2x2(detail::LdShared4(off + t0 * C::kPitch), lo[0], hi[0]);
            detail::Fp8x4ToHalf2x2(detail::LdShared4(off + (t0 + 1) * C::kPitch), lo[1], hi[1]);
            detail::Fp8x4ToHalf2x2(detail::LdShared4(off + (t0 + 8) * C::kPitch), lo[2], hi[2]);
            detail::Fp8x4ToHalf2x2(detail::LdShared4(off + (t0 + 9) * C::kPitch), lo[3], hi[3]);
#pragma unroll
            for (int jj = 0; jj < 4; ++jj) {
              const uint32_t sel = (jj & 1) ? 0x7632 : 0x5410;
              const uint32_t* x = jj < 2 ? lo : hi;
              detail::Mma16816<kMB>(acc[4 * gm + jj], pa[0], pa[1], pa[2], pa[3],
                                    __byte_perm(x[0], x[1], sel), __byte_perm(x[2], x[3], sel));
            }
          }
        } else {
          const int mat = lane / 8;
          const int row = 16 * kk + 8 * (mat & 1) + lane % 8;
#pragma unroll
          for (int ntp = 0; ntp < 4; ++ntp) {
            const int col = slice + 8 * (2 * ntp + (mat >> 1));
            uint32_t b0, b1, b2, b3;
            detail::LdMatrixX4Trans(kv_s + row * C::kPitch + col * 2, b0, b1, b2, b3);
            detail::Mma16816<kMB>(acc[2 * ntp], pa[0], pa[1], pa[2], pa[3], b0, b1);
            detail::Mma16816<kMB>(acc[2 * ntp + 1], pa[0], pa[1], pa[2], pa[3], b2, b3);
          }
        }
      }
      __syncthreads();  // the stage, the partial scores, P and the row statistics are free
      if (warp == 0 && issued < ntiles) issue_next();
    }
    it += ntiles;

    // Outputs of heads r and r + 8 for this warp's value slice.
    float inv[2], lse[2];
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const float l = l_pv[hf];
      inv[hf] = l > 0.0f ? p.v_scale / l : 0.0f;
      lse[hf] = l > 0.0f ? (m_pv[hf] + __log2f(l)) * detail::kLn2 : -INFINITY;
    }
    const bool direct = nsplit == 1;
    const int slice = w * kVSlice;
    auto emit = [&](int hf, int d, float v0, float v1) {
      const int head = head_base + r + 8 * hf;
      if (direct) {
        uint32_t* out =
            static_cast<uint32_t*>(p.o) + ((size_t{1} * b * p.num_heads + head) * kMlaVDim + d) / 2;
        *out = detail::PackFloat2<kQBf16>(v0 * inv[hf], v1 * inv[hf]);
      } else {
        const size_t row = (size_t{1} * b * p.max_splits + split) * p.num_heads + head;
        *reinterpret_cast<float2*>(p.ws.part_o + row * kMlaVDim + d) =
            make_float2(v0 * inv[hf], v1 * inv[hf]);
      }
    };
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      if constexpr (kFp8) {
#pragma unroll
        for (int gm = 0; gm < 2; ++gm) {
#pragma unroll
          for (int pj = 0; pj < 2; ++pj) {
#pragma unroll
            for (int c01 = 0; c01 < 2; ++c01) {
              const int d = slice + 32 * gm + 8 * qd + 4 * c01 + 2 * pj;
              emit(hf, d, acc[4 * gm + 2 * pj][2 * hf + c01],
                   acc[4 * gm + 2 * pj + 1][2 * hf + c01]);
            }
          }
        }
      } else {
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) {
          emit(hf, slice + 8 * nt + 2 * qd, acc[nt][2 * hf], acc[nt][2 * hf + 1]);
        }
      }
      if (w == 0 && qd == 0) {
        const int head = head_base + r + 8 * hf;
        if (direct) {
          if (p.lse != nullptr) p.lse[size_t{1} * b * p.num_heads + head] = lse[hf];
        } else {
          p.ws.part_lse[(size_t{1} * b * p.max_splits + split) * p.num_heads + head] = lse[hf];
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// The kernel (see the design note at the top of this file).

constexpr int kStageTokens = 32;   // tokens per ring stage (one bulk copy per row)
constexpr int kTileTokens = 64;    // tokens per softmax tile: two consecutive stages
constexpr int kConsumerWarps = 4;  // one per 16 tokens of a tile
constexpr int kThreads = (kConsumerWarps + 1) * 32;      // plus the producer warp
constexpr int kKSteps = kMlaKDim / 16;                   // 36
constexpr int kDimsPerWarp = kMlaVDim / kConsumerWarps;  // 128 value dims per warp in P V
constexpr int kMaxSmem = 227 * 1024;                     // the H100/H200 per-block opt-in limit

template <typename KV, int kN, bool kTma>
struct MlaConfig {
  static constexpr int kEB = KvTraits<KV>::kBytes;
  static constexpr bool kMmaBf16 = KvTraits<KV>::kMmaBf16;
  static constexpr int kRowBytes = kMlaKDim * kEB;
  // Per-row copies: padded rows. 16-bit rows shift by 16 bytes (ldmatrix rows on distinct
  // banks), e4m3 rows by 4 words mod 32 (32-bit fragment loads on distinct banks).
  static constexpr int kPitch = kEB == 2 ? 1168 : 656;
  // Tensor copies: the stage is 9 column slabs of 64 elements (kSpan bytes per row), each
  // [32 rows][kSpan] with the 16-byte pieces of a row XOR-swizzled by the copy engine (128-byte
  // swizzle for 16-bit values, 64-byte for e4m3), which spreads the rows over the banks.
  static constexpr int kSpan = kEB == 2 ? 128 : 64;
  static constexpr int kSlabBytes = kStageTokens * kSpan;
  static constexpr int kStageBytes = kTma ? kStageTokens * kRowBytes : kStageTokens * kPitch;
  static_assert(kSlabBytes * (kMlaKDim / 64) == kStageTokens * kRowBytes,
                "a tensor-copied stage is nine column slabs");
  static constexpr int kQPitch = 1168;  // the query as 16-bit MMA operands, per head
  static constexpr int kQBytes = kN * kQPitch;
  static constexpr int kPPitch = 2 * kN + 16;  // P^T: one row of kN 16-bit values per token
  static constexpr int kPBytes = kTileTokens * kPPitch;
  static constexpr int kStatBytes = kConsumerWarps * kN * 4;  // per-warp maxima, then sums
  static constexpr int kFixedBytes = kQBytes + kPBytes + 2 * kStatBytes + 256;
  static constexpr int kStages = (kMaxSmem - 1024 - kFixedBytes) / (kStageBytes + 20);
  static constexpr int kQOffset = kStages * kStageBytes;
  static constexpr int kPOffset = kQOffset + kQBytes;
  static constexpr int kMaxOffset = kPOffset + kPBytes;
  static constexpr int kSumOffset = kMaxOffset + kStatBytes;
  static constexpr int kMetaOffset = kSumOffset + kStatBytes;
  static constexpr int kBarOffset = (kMetaOffset + 4 * kStages + 7) / 8 * 8;
  static constexpr int kSmemBytes = kBarOffset + 16 * kStages + 1024;  // + alignment slack
  static_assert(kStages >= 4, "a tile in use and one in flight at least");
  static_assert(kSmemBytes <= kMaxSmem, "shared memory");
};

// kTma: the producer fills a stage with tensor copies of 64-element column slabs (9 or 18 per
// stage); otherwise with one bulk copy per row (32 per stage, padded rows).
template <typename KV, bool kQBf16, int kN, bool kTma>
__global__ void __launch_bounds__(kThreads, 1)
    MlaDecodeKernel(const __grid_constant__ MlaParams p) {
  using C = MlaConfig<KV, kN, kTma>;
  constexpr bool kFp8 = std::is_same_v<KV, Fp8Tag>;
  constexpr bool kMB = C::kMmaBf16;
  constexpr int kS = C::kStages;
  constexpr int kNT = kN / 8;                // n-tiles of 8 heads
  constexpr int kChains = kNT >= 4 ? 1 : 4;  // independent MMA chains per n-tile in S
  constexpr int kFullArrivals = 1;           // the producer's, with the bytes it expects
  extern __shared__ __align__(128) uint8_t smem_raw[];
  // The copy engine's swizzle follows address bits: stages start on 1024-byte boundaries.
  uint8_t* smem = smem_raw + ((1024 - detail::SmemAddr(smem_raw) % 1024) % 1024);

  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const uint32_t base = detail::SmemAddr(smem);
  const uint32_t full = base + C::kBarOffset;  // stage filled (one arrival + the bytes)
  const uint32_t empty = full + 8 * kS;        // stage read by all consumer warps
  int* meta = reinterpret_cast<int*>(smem + C::kMetaOffset);  // work item of each stage
  if (threadIdx.x == 0) {
    for (int s = 0; s < kS; ++s) {
      detail::MbarInit(full + 8 * s, kFullArrivals);
      detail::MbarInit(empty + 8 * s, kConsumerWarps);
    }
    detail::FenceBarrierInit();
  }
  __syncthreads();

  if (warp == kConsumerWarps) {
    // Producer: takes work items, and streams each one's rows, 32 tokens per stage (lane j
    // copies the row of token 32k + j, clamped to the last token), an even number of stages
    // per item. Every stage names its item; an item of no tokens gets one stage without bytes,
    // and a stage naming item -1 ends the consumers.
    uint32_t g = 0;
    auto acquire = [&]() {
      const uint32_t s = g % kS;
      if (g >= kS) detail::MbarWait(empty + 8 * s, (g / kS - 1) & 1);
      return s;
    };
    auto take = [&]() {
      int v = 0;
      if (lane == 0) v = atomicAdd(p.ws.counter, 1);
      return __shfl_sync(kFull, v, 0);
    };
    int item = take();
    while (true) {
      if (item >= p.total_items) {
        const uint32_t s = acquire();
        if (lane == 0) {
          meta[s] = -1;
          detail::MbarArriveCount(full + 8 * s, kFullArrivals);
        }
        break;
      }
      const int cur = item;
      const int next = take();  // its latency overlaps this item's copies
      const int t = item / p.hchunks;
      const int b = t % p.batch;
      const int split = t / p.batch;
      item = next;
      const int len = p.seq_lens[b];
      const int nsplit = max(1, (len + p.chunk - 1) / p.chunk);
      if (split >= nsplit) continue;
      const int start = split * p.chunk;
      const int end = min(len, start + p.chunk);
      const int nst = 2 * ((end - start + kTileTokens - 1) / kTileTokens);
      if (nst == 0) {
        const uint32_t s = acquire();
        if (lane == 0) {
          meta[s] = cur;
          detail::MbarArriveCount(full + 8 * s, kFullArrivals);
        }
        ++g;
        continue;
      }
      const int32_t* table = p.block_tables + size_t{1} * b * p.max_blocks_per_seq;
      if constexpr (kTma) {
        // Lane 0 copies each stage as (32 / box_rows) x 9 boxes of [box_rows][64 elements].
        // Boxes past the sequence's last token repeat the last valid box (the consumers zero
        // rows past the end), so no table entry beyond the sequence is read.
        const int box = p.box_rows;
        const int last_box = (end - 1) / box * box;
        for (int k = 0; k < nst; ++k) {
          const uint32_t s = acquire();
          if (lane == 0) {
            meta[s] = cur;
            detail::MbarArriveExpectTx(full + 8 * s, kStageTokens * C::kRowBytes);
            const uint32_t dst = base + s * C::kStageBytes;
            for (int h = 0; h < kStageTokens; h += box) {
              const int t = min(start + k * kStageTokens + h, last_box);
              const int blk = __ldg(table + t / p.block_size);
#pragma unroll
              for (int j = 0; j < kMlaKDim / 64; ++j) {
                detail::TmaLoad3D(dst + j * C::kSlabBytes + h * C::kSpan, &p.kv_map, 64 * j,
                                  t % p.block_size, blk, full + 8 * s);
              }
            }
          }
          __syncwarp();
          ++g;
        }
      } else {
        auto token = [&](int k) { return min(start + k * kStageTokens + lane, end - 1); };
        int blk = __ldg(table + token(0) / p.block_size);
        for (int k = 0; k < nst; ++k) {
          const uint32_t s = acquire();
          const int tok = token(k);
          const uint8_t* src =
              p.kv + blk * p.block_stride + int64_t{tok % p.block_size} * C::kRowBytes;
          detail::FenceProxyAsync();
          if (lane == 0) {
            meta[s] = cur;
            detail::MbarArriveExpectTx(full + 8 * s, kStageTokens * C::kRowBytes);
          }
          __syncwarp();
          detail::BulkCopyG2S(base + s * C::kStageBytes + lane * C::kPitch, src, C::kRowBytes,
                              full + 8 * s);
          ++g;
          if (k + 1 < nst) blk = __ldg(table + token(k + 1) / p.block_size);
        }
      }
    }
    return;
  }

  // Consumers: warp w computes the scores of tokens 16w .. 16w + 15 of each 64-token tile for
  // all kN heads over the whole key (S^T = K Q^T, tokens as the MMA's M side), and
  // O^T = V^T P^T for value dims 128w .. 128w + 127 over all 64 tokens.
  const int w = warp;
  const int r = lane / 4;  // fragment row group
  const int qd = lane % 4;
  const int mi = lane / 8;  // ldmatrix: the matrix this lane addresses
  const int mr = lane % 8;  //           and its row
  const uint32_t qsm = base + C::kQOffset;
  const uint32_t psm = base + C::kPOffset;
  uint8_t* psm_ptr = smem + C::kPOffset;
  float* wmax = reinterpret_cast<float*>(smem + C::kMaxOffset);
  float* wsum = reinterpret_cast<float*>(smem + C::kSumOffset);
  constexpr int kBar = 1;  // named barrier of the consumer warps
  constexpr int kBarThreads = kConsumerWarps * 32;
  // Shared address of byte `byte` of row `row` (0-31) of the stage at `stage`.
  auto kv_at = [](uint32_t stage, int row, int byte) -> uint32_t {
    if constexpr (kTma) {
      const int within = byte % C::kSpan;
      const int piece = within / 16;
      const int swz = C::kSpan == 128 ? piece ^ (row & 7) : piece ^ ((row >> 1) & 3);
      return stage + (byte / C::kSpan) * C::kSlabBytes + row * C::kSpan + 16 * swz + within % 16;
    } else {
      return stage + row * C::kPitch + byte;
    }
  };

  uint32_t g = 0;  // stages consumed so far (mirrors the producer)
  while (true) {
    const uint32_t s0 = g % kS;
    detail::MbarWait(full + 8 * s0, (g / kS) & 1);
    const int item = meta[s0];
    if (item < 0) break;
    int t = item;
    const int hc = t % p.hchunks;
    t /= p.hchunks;
    const int b = t % p.batch;
    const int split = t / p.batch;
    const int len = p.seq_lens[b];
    const int nsplit = max(1, (len + p.chunk - 1) / p.chunk);
    const int start = split * p.chunk;
    const int end = min(len, start + p.chunk);
    const int ntiles = (end - start + kTileTokens - 1) / kTileTokens;
    const int head_base = hc * kN;

    // The query of this item's heads into shared memory as 16-bit MMA operands. With e4m3
    // keys the dims are permuted inside each k-step as the keys' fragments are (below). The
    // previous item's readers passed the barrier before its output.
    if (ntiles > 0) {  // (the barrier below is taken in any case: it also guards wsum)
      const uint4* qg = reinterpret_cast<const uint4*>(
          static_cast<const uint16_t*>(p.q) + (size_t{1} * b * p.num_heads + head_base) * kMlaKDim);
      constexpr int kChunks = kN * kMlaKDim / 8;  // 16-byte pieces
#pragma unroll
      for (int i0 = 0; i0 < kChunks; i0 += kBarThreads) {
        const int i = i0 + threadIdx.x;
        const uint4 v = __ldg(qg + i);
        const int head = i / (kMlaKDim / 8);
        const int d8 = i % (kMlaKDim / 8);  // 8 dims: half (d8 % 2) of k-step d8 / 2
        const uint32_t words[4] = {v.x, v.y, v.z, v.w};
        uint8_t* row = smem + C::kQOffset + head * C::kQPitch + 32 * (d8 / 2);
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          const int pi = 4 * (d8 % 2) + u;  // pair index within the k-step
          const int dst = kFp8 ? pi / 2 + 4 * (pi % 2) : pi;
          *reinterpret_cast<uint32_t*>(row + 4 * dst) = detail::ConvertPair<kQBf16, kMB>(words[u]);
        }
      }
    }
    detail::NamedBarrier(kBar, kBarThreads);

    float m_run[kNT][2], l_run[kNT][2];
    float acc[8][kNT][4];
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) {
      m_run[nt][0] = m_run[nt][1] = -INFINITY;
      l_run[nt][0] = l_run[nt][1] = 0.0f;
#pragma unroll
      for (int mt = 0; mt < 8; ++mt)
        acc[mt][nt][0] = acc[mt][nt][1] = acc[mt][nt][2] = acc[mt][nt][3] = 0.0f;
    }

    if (ntiles == 0) {
      __syncwarp();
      if (lane == 0) detail::MbarArrive(empty + 8 * s0);
      ++g;
    }
    for (int k = 0; k < ntiles; ++k) {
      const uint32_t sa = g % kS, sb = (g + 1) % kS;
      detail::MbarWait(full + 8 * sa, (g / kS) & 1);
      detail::MbarWait(full + 8 * sb, ((g + 1) / kS) & 1);
      const uint32_t stage_a = base + sa * C::kStageBytes;
      const uint32_t stage_b = base + sb * C::kStageBytes;
      const int tok0 = start + k * kTileTokens;
      if constexpr (kTma) {
        // Rows past the sequence end hold other cache slots (maybe NaN): zero them, so that
        // their zero probabilities meet finite values.
        const int valid = end - tok0;
        if (valid < kTileTokens) {
          constexpr int kPieces = C::kRowBytes / 16;
          for (int i = threadIdx.x; i < (kTileTokens - valid) * kPieces; i += kBarThreads) {
            const int row = valid + i / kPieces;
            const uint32_t st = row < kStageTokens ? stage_a : stage_b;
            detail::StShared16Zero(kv_at(st, row % kStageTokens, 16 * (i % kPieces)));
          }
          detail::FenceProxyAsync();  // before the copy engine writes these bytes again
          detail::NamedBarrier(kBar, kBarThreads);
        }
      }

      // 1. S^T for this warp's 16 tokens, all heads, all 576 key dims.
      const uint32_t kstage = w < 2 ? stage_a : stage_b;
      const int krow = 16 * (w % 2);  // this warp's first row in that stage
      float sc[kChains][kNT][4];
#pragma unroll
      for (int c = 0; c < kChains; ++c) {
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt)
          sc[c][nt][0] = sc[c][nt][1] = sc[c][nt][2] = sc[c][nt][3] = 0.0f;
      }
      // Fragments are loaded kDist k-steps ahead of their MMAs (ptxas keeps the written order
      // of the inline-asm loads and MMAs, so the prefetch has to be spelled out).
      constexpr int kDist = kNT >= 4 ? 1 : 2;
      constexpr int kBuf = kDist + 1;
      uint32_t af[kBuf][4], bq[kBuf][kNT / 2][4];
      auto load_s = [&](int ks, uint32_t(&a)[4], uint32_t(&bb)[kNT / 2][4]) {
        if constexpr (kFp8) {  // raw e4m3 words, converted at use
          a[0] = detail::LdShared4(kv_at(kstage, krow + r, 16 * ks + 4 * qd));
          a[1] = detail::LdShared4(kv_at(kstage, krow + r + 8, 16 * ks + 4 * qd));
        } else {
          detail::LdMatrixX4(kv_at(kstage, krow + 8 * (mi & 1) + mr, 32 * ks + 16 * (mi >> 1)),
                             a[0], a[1], a[2], a[3]);
        }
#pragma unroll
        for (int np = 0; np < kNT / 2; ++np) {
          detail::LdMatrixX4(
              qsm + (16 * np + 8 * (mi >> 1) + mr) * C::kQPitch + (16 * ks + 8 * (mi & 1)) * 2,
              bb[np][0], bb[np][1], bb[np][2], bb[np][3]);
        }
      };
#pragma unroll
      for (int i = 0; i < kDist; ++i) load_s(i, af[i], bq[i]);
#pragma unroll
      for (int ks = 0; ks < kKSteps; ++ks) {
        if (ks + kDist < kKSteps) {
          load_s(ks + kDist, af[(ks + kDist) % kBuf], bq[(ks + kDist) % kBuf]);
        }
        const int cb = ks % kBuf;
        uint32_t a0, a1, a2, a3;
        if constexpr (kFp8) {
          detail::Fp8x4ToHalf2x2(af[cb][0], a0, a2);
          detail::Fp8x4ToHalf2x2(af[cb][1], a1, a3);
        } else {
          a0 = af[cb][0];
          a1 = af[cb][1];
          a2 = af[cb][2];
          a3 = af[cb][3];
        }
#pragma unroll
        for (int np = 0; np < kNT / 2; ++np) {
          detail::Mma16816<kMB>(sc[ks % kChains][2 * np], a0, a1, a2, a3, bq[cb][np][0],
                                bq[cb][np][1]);
          detail::Mma16816<kMB>(sc[ks % kChains][2 * np + 1], a0, a1, a2, a3, bq[cb][np][2],
                                bq[cb][np][3]);
        }
      }
#pragma unroll
      for (int ch = 1; ch < kChains; ++ch) {
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
          for (int c = 0; c < 4; ++c) sc[0][nt][c] += sc[ch][nt][c];
        }
      }

      // 2. Scale, mask, this warp's maxima per head; then the tile's, from all four warps.
      const bool valid_lo = tok0 + 16 * w + r < end;
      const bool valid_hi = tok0 + 16 * w + r + 8 < end;
      float x[kNT][4];
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) {
        x[nt][0] = valid_lo ? sc[0][nt][0] * p.scale_log2 : -INFINITY;
        x[nt][1] = valid_lo ? sc[0][nt][1] * p.scale_log2 : -INFINITY;
        x[nt][2] = valid_hi ? sc[0][nt][2] * p.scale_log2 : -INFINITY;
        x[nt][3] = valid_hi ? sc[0][nt][3] * p.scale_log2 : -INFINITY;
        float m0 = fmaxf(x[nt][0], x[nt][2]), m1 = fmaxf(x[nt][1], x[nt][3]);
#pragma unroll
        for (int off = 4; off < 32; off *= 2) {
          m0 = fmaxf(m0, __shfl_xor_sync(kFull, m0, off));
          m1 = fmaxf(m1, __shfl_xor_sync(kFull, m1, off));
        }
        if (r == 0)
          *reinterpret_cast<float2*>(wmax + w * kN + 8 * nt + 2 * qd) = make_float2(m0, m1);
      }
      detail::NamedBarrier(kBar, kBarThreads);
      float alpha[kNT][2];
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) {
        float2 tm = *reinterpret_cast<const float2*>(wmax + 8 * nt + 2 * qd);
#pragma unroll
        for (int ww = 1; ww < kConsumerWarps; ++ww) {
          const float2 v = *reinterpret_cast<const float2*>(wmax + ww * kN + 8 * nt + 2 * qd);
          tm.x = fmaxf(tm.x, v.x);
          tm.y = fmaxf(tm.y, v.y);
        }
        // Finite: token 0 of a tile is always valid.
        const float mn0 = fmaxf(m_run[nt][0], tm.x), mn1 = fmaxf(m_run[nt][1], tm.y);
        alpha[nt][0] = exp2f(m_run[nt][0] - mn0);
        alpha[nt][1] = exp2f(m_run[nt][1] - mn1);
        m_run[nt][0] = mn0;
        m_run[nt][1] = mn1;
        const float p0 = exp2f(x[nt][0] - mn0), p1 = exp2f(x[nt][1] - mn1);
        const float p2 = exp2f(x[nt][2] - mn0), p3 = exp2f(x[nt][3] - mn1);
        l_run[nt][0] = l_run[nt][0] * alpha[nt][0] + (p0 + p2);
        l_run[nt][1] = l_run[nt][1] * alpha[nt][1] + (p1 + p3);
        uint8_t* prow = psm_ptr + (16 * w + r) * C::kPPitch + (8 * nt + 2 * qd) * 2;
        *reinterpret_cast<uint32_t*>(prow) = detail::PackFloat2<kMB>(p0, p1);
        *reinterpret_cast<uint32_t*>(prow + 8 * C::kPPitch) = detail::PackFloat2<kMB>(p2, p3);
      }
      detail::NamedBarrier(kBar, kBarThreads);  // P complete; every warp is past the maxima

      // 3. O^T = O^T * alpha + V^T P^T over this warp's 128 value dims.
#pragma unroll
      for (int mt = 0; mt < 8; ++mt) {
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
          for (int c = 0; c < 4; ++c) acc[mt][nt][c] *= alpha[nt][c & 1];
        }
      }
      // P^T fragments of the whole tile first, then the value fragments kVDist steps ahead of
      // their MMAs. Stage a (tokens 0-31) is released as soon as its last MMA has its operands.
      constexpr int kKS = kTileTokens / 16;
      uint32_t pb[kKS][kNT][2];
#pragma unroll
      for (int ks = 0; ks < kKS; ++ks) {
#pragma unroll
        for (int np = 0; np < kNT / 2; ++np) {
          detail::LdMatrixX4Trans(
              psm + (16 * ks + 8 * (mi & 1) + mr) * C::kPPitch + (16 * np + 8 * (mi >> 1)) * 2,
              pb[ks][2 * np][0], pb[ks][2 * np][1], pb[ks][2 * np + 1][0], pb[ks][2 * np + 1][1]);
        }
      }
      auto vstage = [&](int ks) { return ks < 2 ? stage_a : stage_b; };
      auto release_a = [&] {
        __syncwarp();
        if (lane == 0) detail::MbarArrive(empty + 8 * sa);
      };
      if constexpr (kFp8) {
        // Step i: tokens 16 (i / 4) .., dims 32 (i % 4) + [0, 32) of this warp's slice.
        constexpr int kSteps = kKS * 4, kVDist = 1;
        uint32_t vx[kVDist + 1][4];
        auto load_v = [&](int i, uint32_t(&x)[4]) {
          const uint32_t st = vstage(i / 4);
          const int row = 16 * ((i / 4) % 2) + 2 * qd;
          const int byte = w * kDimsPerWarp + 32 * (i % 4) + 4 * r;
          x[0] = detail::LdShared4(kv_at(st, row, byte));
          x[1] = detail::LdShared4(kv_at(st, row + 1, byte));
          x[2] = detail::LdShared4(kv_at(st, row + 8, byte));
          x[3] = detail::LdShared4(kv_at(st, row + 9, byte));
        };
        load_v(0, vx[0]);
#pragma unroll
        for (int i = 0; i < kSteps; ++i) {
          if (i + kVDist < kSteps) load_v(i + kVDist, vx[(i + kVDist) % (kVDist + 1)]);
          const uint32_t(&x)[4] = vx[i % (kVDist + 1)];
          const int ks = i / 4, gm = i % 4;
          uint32_t lo[4], hi[4];
#pragma unroll
          for (int j = 0; j < 4; ++j) detail::Fp8x4ToHalf2x2(x[j], lo[j], hi[j]);
#pragma unroll
          for (int hh = 0; hh < 2; ++hh) {
            const uint32_t* x4 = hh ? hi : lo;
            const uint32_t a0 = __byte_perm(x4[0], x4[1], 0x5410);
            const uint32_t a1 = __byte_perm(x4[0], x4[1], 0x7632);
            const uint32_t a2 = __byte_perm(x4[2], x4[3], 0x5410);
            const uint32_t a3 = __byte_perm(x4[2], x4[3], 0x7632);
#pragma unroll
            for (int nt = 0; nt < kNT; ++nt) {
              detail::Mma16816<kMB>(acc[2 * gm + hh][nt], a0, a1, a2, a3, pb[ks][nt][0],
                                    pb[ks][nt][1]);
            }
          }
          if (i == 2 * 4 - 1) release_a();
        }
      } else {
        // Step i: tokens 16 (i / 8) .., dims 16 (i % 8) + [0, 16) of this warp's slice.
        constexpr int kSteps = kKS * 8, kVDist = 2;
        uint32_t va[kVDist + 1][4];
        auto load_v = [&](int i, uint32_t(&a)[4]) {
          detail::LdMatrixX4Trans(kv_at(vstage(i / 8), 16 * ((i / 8) % 2) + 8 * (mi >> 1) + mr,
                                        2 * (w * kDimsPerWarp + 16 * (i % 8) + 8 * (mi & 1))),
                                  a[0], a[1], a[2], a[3]);
        };
#pragma unroll
        for (int i = 0; i < kVDist; ++i) load_v(i, va[i]);
#pragma unroll
        for (int i = 0; i < kSteps; ++i) {
          if (i + kVDist < kSteps) load_v(i + kVDist, va[(i + kVDist) % (kVDist + 1)]);
          const uint32_t(&a)[4] = va[i % (kVDist + 1)];
#pragma unroll
          for (int nt = 0; nt < kNT; ++nt) {
            detail::Mma16816<kMB>(acc[i % 8][nt], a[0], a[1], a[2], a[3], pb[i / 8][nt][0],
                                  pb[i / 8][nt][1]);
          }
          if (i == 2 * 8 - 1) release_a();
        }
      }
      __syncwarp();
      if (lane == 0) detail::MbarArrive(empty + 8 * sb);
      g += 2;
    }

    // Row sums: over this warp's tokens (lanes of one qd), then over the four warps. The
    // barrier also ends every warp's reads of the query for this item.
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float v = l_run[nt][e];
#pragma unroll
        for (int off = 4; off < 32; off *= 2) v += __shfl_xor_sync(kFull, v, off);
        l_run[nt][e] = v;
      }
      if (r == 0) {
        *reinterpret_cast<float2*>(wsum + w * kN + 8 * nt + 2 * qd) =
            make_float2(l_run[nt][0], l_run[nt][1]);
      }
    }
    detail::NamedBarrier(kBar, kBarThreads);
    float inv[kNT][2], lse[kNT][2];
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) {
      float2 l = make_float2(0.0f, 0.0f);
#pragma unroll
      for (int ww = 0; ww < kConsumerWarps; ++ww) {
        const float2 v = *reinterpret_cast<const float2*>(wsum + ww * kN + 8 * nt + 2 * qd);
        l.x += v.x;
        l.y += v.y;
      }
      const float ls[2] = {l.x, l.y};
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        inv[nt][e] = ls[e] > 0.0f ? p.v_scale / ls[e] : 0.0f;
        lse[nt][e] = ls[e] > 0.0f ? (m_run[nt][e] + __log2f(ls[e])) * detail::kLn2 : -INFINITY;
      }
    }
    // Nobody may overwrite the sums before all have read them: the next item's first write
    // of wsum comes after its query barrier, which every warp reaches after this point.

    const bool direct = nsplit == 1;
#pragma unroll
    for (int mt = 0; mt < 8; ++mt) {
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          // Row of the accumulator: value dim; column: head.
          int d;
          if constexpr (kFp8) {
            d = w * kDimsPerWarp + 32 * (mt / 2) + 4 * r + 2 * (mt % 2) + (c >> 1);
          } else {
            d = w * kDimsPerWarp + 16 * mt + r + 8 * (c >> 1);
          }
          const int hl = 8 * nt + 2 * qd + (c & 1);
          const int head = head_base + hl;
          const float v = acc[mt][nt][c] * inv[nt][c & 1];
          if (direct) {
            uint16_t* out =
                static_cast<uint16_t*>(p.o) + (size_t{1} * b * p.num_heads + head) * kMlaVDim + d;
            *out = static_cast<uint16_t>(detail::PackFloat2<kQBf16>(v, 0.0f) & 0xffffu);
          } else {
            const size_t row = (size_t{1} * b * p.max_splits + split) * p.num_heads + head;
            p.ws.part_o[row * kMlaVDim + d] = v;
          }
        }
      }
    }
    if (w == 0 && r == 0) {
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int head = head_base + 8 * nt + 2 * qd + e;
          if (direct) {
            if (p.lse != nullptr) p.lse[size_t{1} * b * p.num_heads + head] = lse[nt][e];
          } else {
            p.ws.part_lse[(size_t{1} * b * p.max_splits + split) * p.num_heads + head] = lse[nt][e];
          }
        }
      }
    }
  }
}

// Plans the split size, carves the workspace, launches `kernel` on a persistent grid of `ctas`
// blocks over items of `heads_per_item` heads and merges the splits; with `need` set, only
// computes the workspace this call would use at most and stores it.
template <bool kOutBf16, typename Kernel>
cudaError_t LaunchMla(Kernel kernel, int threads, int smem_bytes, int ctas, int heads_per_item,
                      int granule, MlaParams p, int max_seq_len, size_t workspace_bytes,
                      void* workspace, cudaStream_t stream, size_t* need) {
  if (ctas <= 0) return cudaErrorInvalidConfiguration;
  p.hchunks = p.num_heads / heads_per_item;
  auto chunk_for = [&](int cap) {
    return detail::ChooseChunk(int64_t{p.batch} * p.hchunks, max_seq_len, ctas, granule,
                               /*min_chunk=*/256, /*waves=*/4, cap);
  };
  if (need != nullptr) {
    *need = detail::SplitWorkspaceBytes(p.batch, detail::NumSplits(max_seq_len, chunk_for(0)),
                                        p.num_heads, kMlaVDim);
    return cudaSuccess;
  }
  if (workspace_bytes < detail::kCounterBytes) return cudaErrorInvalidValue;
  const int64_t per_split = int64_t{4} * p.batch * p.num_heads * (kMlaVDim + 1);
  const int cap = static_cast<int>(std::clamp<int64_t>(
      (static_cast<int64_t>(workspace_bytes) - detail::kCounterBytes) / per_split, 1, 1 << 20));
  const int chunk = chunk_for(cap);
  p.chunk = chunk;
  p.max_splits = detail::NumSplits(max_seq_len, chunk);
  p.ws = detail::CarveSplitWorkspace(workspace, p.batch, p.max_splits, p.num_heads);
  const int64_t items = int64_t{p.max_splits} * p.batch * p.hchunks;
  if (items > INT32_MAX) return cudaErrorInvalidValue;
  p.total_items = static_cast<int>(items);
  if (cudaError_t e = cudaMemsetAsync(p.ws.counter, 0, sizeof(int), stream); e != cudaSuccess) {
    return e;
  }
  const int grid = static_cast<int>(std::min<int64_t>(ctas, items));
  kernel<<<grid, threads, smem_bytes, stream>>>(p);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  if (p.max_splits > 1) {
    return detail::LaunchMergeSplits<kOutBf16, kMlaVDim>(p.ws, p.seq_lens, p.batch, p.num_heads,
                                                         p.max_splits, chunk, p.o, p.lse, stream);
  }
  return cudaSuccess;
}

// Blocks of `kernel` that fit on the device at once (0 if it cannot run).
template <typename Kernel>
int ResidentCtasOf(Kernel kernel, int threads, int smem_bytes) {
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes) !=
      cudaSuccess) {
    return 0;
  }
  int per_sm = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem_bytes) !=
      cudaSuccess) {
    return 0;
  }
  return per_sm * detail::NumSms();
}

template <typename KV, bool kQBf16, int kN, bool kTma>
cudaError_t RunMla(const MlaParams& p, int max_seq_len, size_t ws_bytes, void* ws,
                   cudaStream_t stream, size_t* need) {
  using C = MlaConfig<KV, kN, kTma>;
  auto kernel = MlaDecodeKernel<KV, kQBf16, kN, kTma>;
  static const int ctas = ResidentCtasOf(kernel, kThreads, C::kSmemBytes);
  return LaunchMla<kQBf16>(kernel, kThreads, C::kSmemBytes, ctas, kN, kTileTokens, p, max_seq_len,
                           ws_bytes, ws, stream, need);
}

// The copy engine's tensor-map encoder, from the driver through the runtime (null if absent).
PFN_cuTensorMapEncodeTiled_v12000 TensorMapEncoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault,
                                         &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
      return static_cast<PFN_cuTensorMapEncodeTiled_v12000>(nullptr);
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

// Describes the cache to the copy engine as [blocks][block_size][576] elements, boxes of
// [box_rows][64]. The block count is not known here and serves only bounds checks (the kernel
// never asks for a block outside the block tables), so it is set large.
bool EncodeKvMap(MlaParams& p, int eb, bool bf16) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = TensorMapEncoder();
  if (encode == nullptr) return false;
  const cuuint64_t dims[3] = {kMlaKDim, static_cast<cuuint64_t>(p.block_size), cuuint64_t{1} << 24};
  const cuuint64_t strides[2] = {cuuint64_t{kMlaKDim} * eb,
                                 static_cast<cuuint64_t>(p.block_stride)};
  const cuuint32_t box[3] = {64, static_cast<cuuint32_t>(p.box_rows), 1};
  const cuuint32_t unit[3] = {1, 1, 1};
  const CUtensorMapDataType type = eb == 1 ? CU_TENSOR_MAP_DATA_TYPE_UINT8
                                   : bf16  ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                           : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  return encode(&p.kv_map, type, 3, const_cast<uint8_t*>(p.kv), dims, strides, box, unit,
                CU_TENSOR_MAP_INTERLEAVE_NONE,
                eb == 1 ? CU_TENSOR_MAP_SWIZZLE_64B : CU_TENSOR_MAP_SWIZZLE_128B,
                CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// Tensor copies where the block size is a multiple of 16 (boxes never cross a block) and the
// driver offers the encoder; one bulk copy per row otherwise, and for e4m3 caches at 32 heads
// per block (whose tensor-copy kernel spills registers and measured slower).
template <typename KV, bool kQBf16, int kN>
cudaError_t RunMlaCopies(MlaParams& p, int max_seq_len, size_t ws_bytes, void* ws,
                         cudaStream_t stream, size_t* need, bool allow_tma = true) {
  if constexpr (!(std::is_same_v<KV, Fp8Tag> && kN == 32)) {
    if (allow_tma && p.block_size % 16 == 0) {
      p.box_rows = p.block_size % 32 == 0 ? 32 : 16;
      if (need != nullptr || EncodeKvMap(p, KvTraits<KV>::kBytes, std::is_same_v<KV, Bf16Tag>)) {
        return RunMla<KV, kQBf16, kN, true>(p, max_seq_len, ws_bytes, ws, stream, need);
      }
    }
  }
  return RunMla<KV, kQBf16, kN, false>(p, max_seq_len, ws_bytes, ws, stream, need);
}

// The previous kernel, kept as a benchmark variant (KernelTuning::mla_variant).
template <typename KV, bool kQBf16, int kMT, bool kDeep = false>
cudaError_t RunMlaV1(const MlaParams& p, int max_seq_len, size_t ws_bytes, void* ws,
                     cudaStream_t stream, size_t* need) {
  using C = MlaV1Config<KV, kMT, kDeep>;
  auto kernel = MlaV1Kernel<KV, kQBf16, kMT, kDeep>;
  static const int ctas = ResidentCtasOf(kernel, C::kThreads, C::kSmemBytes);
  return LaunchMla<kQBf16>(kernel, C::kThreads, C::kSmemBytes, ctas, 16 * kMT, kTile, p,
                           max_seq_len, ws_bytes, ws, stream, need);
}

template <typename KV, bool kQBf16>
cudaError_t DispatchHeads(MlaParams& p, int max_seq_len, size_t ws_bytes, void* ws,
                          cudaStream_t stream, size_t* need) {
  const bool by32 = p.num_heads % 32 == 0;
  switch (GetKernelTuning().mla_variant) {
    case 1:
      if (by32) return RunMlaV1<KV, kQBf16, 2>(p, max_seq_len, ws_bytes, ws, stream, need);
      return RunMlaV1<KV, kQBf16, 1>(p, max_seq_len, ws_bytes, ws, stream, need);
    case 2:
      return RunMlaV1<KV, kQBf16, 1, true>(p, max_seq_len, ws_bytes, ws, stream, need);
    case 3:
      return RunMlaCopies<KV, kQBf16, 16>(p, max_seq_len, ws_bytes, ws, stream, need);
    case 4:
      if (by32) {
        return RunMlaCopies<KV, kQBf16, 32>(p, max_seq_len, ws_bytes, ws, stream, need, false);
      }
      return RunMlaCopies<KV, kQBf16, 16>(p, max_seq_len, ws_bytes, ws, stream, need, false);
    default:
      if (by32) return RunMlaCopies<KV, kQBf16, 32>(p, max_seq_len, ws_bytes, ws, stream, need);
      return RunMlaCopies<KV, kQBf16, 16>(p, max_seq_len, ws_bytes, ws, stream, need);
  }
}

// Validates, fills the parameters and dispatches; with `need` set, plans only.
cudaError_t MlaDispatch(const void* q, DType q_type, const void* kv_cache, DType kv_type,
                        const int32_t* block_tables, const int32_t* seq_lens, int max_seq_len,
                        const MlaDecodeShape& shape, const AttentionScales& scales, void* o,
                        float* lse, void* workspace, size_t workspace_bytes, cudaStream_t stream,
                        size_t* need) {
  if (shape.batch <= 0) {
    if (need != nullptr) *need = detail::kCounterBytes;
    return cudaSuccess;
  }
  if (shape.num_heads <= 0 || shape.num_heads % 16 != 0 || shape.block_size <= 0 ||
      max_seq_len < 0 || (workspace == nullptr && need == nullptr)) {
    return cudaErrorInvalidValue;
  }
  if (q_type == DType::kFP8E4M3) return cudaErrorInvalidValue;
  if (kv_type != q_type && kv_type != DType::kFP8E4M3) return cudaErrorInvalidValue;
  const int eb = DTypeBytes(kv_type);
  MlaParams p{};
  p.q = q;
  p.kv = static_cast<const uint8_t*>(kv_cache);
  p.block_stride = shape.block_stride * eb;
  if ((reinterpret_cast<uintptr_t>(kv_cache) & 15) != 0 || (p.block_stride & 15) != 0 ||
      (reinterpret_cast<uintptr_t>(q) & 15) != 0 || (reinterpret_cast<uintptr_t>(o) & 15) != 0) {
    return cudaErrorInvalidValue;
  }
  p.block_tables = block_tables;
  p.seq_lens = seq_lens;
  p.o = o;
  p.lse = lse;
  p.batch = shape.batch;
  p.num_heads = shape.num_heads;
  p.block_size = shape.block_size;
  p.max_blocks_per_seq = shape.max_blocks_per_seq;
  p.scale_log2 = scales.sm_scale * scales.k_scale * detail::kLog2e;
  p.v_scale = scales.v_scale;
  max_seq_len = std::max(max_seq_len, 1);
  const size_t wb = workspace_bytes;
  switch (kv_type) {
    case DType::kBF16:
      return DispatchHeads<Bf16Tag, true>(p, max_seq_len, wb, workspace, stream, need);
    case DType::kFP16:
      return DispatchHeads<Fp16Tag, false>(p, max_seq_len, wb, workspace, stream, need);
    case DType::kFP8E4M3:
      if (q_type == DType::kBF16) {
        return DispatchHeads<Fp8Tag, true>(p, max_seq_len, wb, workspace, stream, need);
      }
      return DispatchHeads<Fp8Tag, false>(p, max_seq_len, wb, workspace, stream, need);
  }
  return cudaErrorInvalidValue;
}

}  // namespace

size_t MlaDecodeWorkspaceBytes(const MlaDecodeShape& shape, DType q_type, DType kv_type,
                               int max_seq_len) {
  size_t need = 0;
  if (MlaDispatch(nullptr, q_type, nullptr, kv_type, nullptr, nullptr, max_seq_len, shape,
                  AttentionScales{}, nullptr, nullptr, nullptr, 0, nullptr, &need) != cudaSuccess) {
    return 0;
  }
  return need;
}

cudaError_t MlaDecode(const void* q, DType q_type, const void* kv_cache, DType kv_type,
                      const int32_t* block_tables, const int32_t* seq_lens, int max_seq_len,
                      const MlaDecodeShape& shape, const AttentionScales& scales, void* o,
                      float* lse, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  return MlaDispatch(q, q_type, kv_cache, kv_type, block_tables, seq_lens, max_seq_len, shape,
                     scales, o, lse, workspace, workspace_bytes, stream, nullptr);
}

}  // namespace kvpool::kernels
