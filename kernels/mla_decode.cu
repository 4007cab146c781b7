#include "kernels/mla_decode.cuh"

#include <cuda.h>  // CUtensorMap and its encoder's types (the encoder comes via cudart)
#include <cudaTypedefs.h>

#include <algorithm>
#include <string>
#include <type_traits>

#include "kernels/cuda_common.cuh"
#include "kernels/decode_common.cuh"

// Design (docs/kernels.md has the long form):
//  - A work item is (sequence, group of kN = 16 or 32 heads, tokens [start, end)). One block per
//  SM:
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
//  - Work items come from PlanMlaDecode (decode_plan.h: real lengths, long sequences split into
//    equal parts, longest first); split sequences are merged by MergePartialsKernel.

namespace kvpool::kernels {
namespace {

constexpr unsigned kFull = 0xffffffffu;

struct MlaParams {
  CUtensorMap kv_map;  // the cache as [num_blocks][block_size][576] for tensor copies
  CUtensorMap q_map;   // the query as [batch][num_heads][576], boxes of [64 heads][64] (wgmma)
  int box_rows;        // rows per tensor copy: 64 (wgmma kernel only), 32, or 16
  const void* q;
  const uint8_t* kv;
  int64_t block_stride;  // bytes
  const int32_t* block_tables;
  const int32_t* seq_lens;
  void* o;
  float* lse;
  detail::PlanWorkspace ws;
  int batch;
  int num_heads;
  int block_size;
  int max_blocks_per_seq;
  int total_items;
  int chained;  // 1 (span plans): block i takes item i, then items[i].next; 0: the counter
  int lazy_rescale;  // wgmma kernel: the running max moves only by more than 8 (log2)
  float scale_log2;
  float v_scale;
};

// The producer warp's walk over its block's work items, shared by both MLA kernels: it takes
// items from the plan (the counter, or the chain of a span plan), hands each item that has tokens
// to `copy_item(cur, item, end, tiles, take_stage)` (item: seq, unit, start, end as planned; `end`
// clamped to the sequence's length; `tiles` of kTile tokens), gives an item of no tokens one
// stage without bytes, and ends the consumers with a stage naming item -1. `take_stage()`
// returns the next stage of the ring once every consumer warp has released it. Each stage's
// `meta` entry names its item; its `full` mbarrier expects kArrivals arrivals from the producer
// (with the bytes, for a stage it copies).
template <int kStages, int kArrivals, int kTile, typename CopyItem>
__device__ __forceinline__ void MlaProduceItems(const MlaParams& p, uint32_t full, uint32_t empty,
                                                int* meta, int lane, CopyItem&& copy_item) {
  uint32_t g = 0;  // stages taken so far
  auto take_stage = [&]() {
    const uint32_t s = g % kStages;
    if (g >= kStages) detail::MbarWait(empty + 8 * s, (g / kStages - 1) & 1);
    ++g;
    return s;
  };
  auto mark_stage = [&](uint32_t s, int item) {
    if (lane == 0) {
      meta[s] = item;
      detail::MbarArriveCount(full + 8 * s, kArrivals);
    }
  };
  int item = detail::WarpFirstItem(p.ws.counter, p.chained, lane);
  while (item >= 0 && item < p.total_items) {
    const int cur = item;
    item = detail::WarpNextItem(p.ws, p.chained, cur, lane);  // overlaps the copies
    const int4 wi = *reinterpret_cast<const int4*>(p.ws.items + cur);  // seq, unit, start, end
    const int end = max(wi.z, min(p.seq_lens[wi.x], wi.w));
    const int tiles = (end - wi.z + kTile - 1) / kTile;
    if (tiles == 0) {
      mark_stage(take_stage(), cur);
    } else {
      copy_item(cur, wi, end, tiles, take_stage);
    }
  }
  if (lane == 0 && !p.chained) detail::FinishWorkCounter(p.ws.counter);
  mark_stage(take_stage(), -1);
}

}  // namespace
}  // namespace kvpool::kernels

#include "kernels/mla_decode_wgmma.cuh"  // 64 heads per block on wgmma (MlaWgmmaKernel)

namespace kvpool::kernels {
namespace {

using detail::Bf16Tag;
using detail::Fp16Tag;
using detail::Fp8Tag;
using detail::KvTraits;

// ---------------------------------------------------------------------------------------------
// The mma.sync kernel, 16 or 32 heads per block (see the design note at the top of this file).

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
  detail::LaunchDependents();  // the merge kernel may be scheduled now; it waits for our end
  __syncthreads();

  if (warp == kConsumerWarps) {
    // Producer: streams each item's rows, 32 tokens per stage (lane j copies the row of token
    // 32k + j, clamped to the last token), an even number of stages per item.
    auto copy_item = [&](int cur, int4 wi, int end, int tiles, auto&& take_stage) {
      const int start = wi.z;
      const int nst = 2 * tiles;
      const int32_t* table = p.block_tables + size_t{1} * wi.x * p.max_blocks_per_seq;
      if constexpr (kTma) {
        // Lane 0 copies each stage as (32 / box_rows) x 9 boxes of [box_rows][64 elements].
        // Boxes past the sequence's last token repeat the last valid box (the consumers zero
        // rows past the end), so no table entry beyond the sequence is read.
        const int box = p.box_rows;
        const int last_box = (end - 1) / box * box;
        for (int k = 0; k < nst; ++k) {
          const uint32_t s = take_stage();
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
        }
      } else {
        auto token = [&](int k) { return min(start + k * kStageTokens + lane, end - 1); };
        int blk = __ldg(table + token(0) / p.block_size);
        for (int k = 0; k < nst; ++k) {
          const uint32_t s = take_stage();
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
          if (k + 1 < nst) blk = __ldg(table + token(k + 1) / p.block_size);
        }
      }
    };
    MlaProduceItems<kS, kFullArrivals, kTileTokens>(p, full, empty, meta, lane, copy_item);
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
    const int4 wi = *reinterpret_cast<const int4*>(p.ws.items + item);  // seq, unit, start, end
    const int b = wi.x;
    const int len = p.seq_lens[b];
    const int start = wi.z;
    const int end = max(start, min(len, wi.w));
    const int ntiles = (end - start + kTileTokens - 1) / kTileTokens;
    const int head_base = wi.y * kN;

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

    const int slot = __ldg(&p.ws.items[item].slot);  // read late: one register less in the loop
    const bool direct = slot < 0;
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
            const size_t row = size_t{1} * slot * p.num_heads + head;
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
            p.ws.part_lse[size_t{1} * slot * p.num_heads + head] = lse[nt][e];
          }
        }
      }
    }
  }
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

// Launches one MLA kernel over a plan: persistent blocks take the plan's items from the work
// counter (longest first); the merge kernel combines the split sequences.
template <auto kKernel, int kBlockThreads, int kSmemBytes, bool kOutBf16>
struct MlaKernelLauncher {
  static int ResidentCtas() {
    static const int ctas = ResidentCtasOf(kKernel, kBlockThreads, kSmemBytes);
    return ctas;
  }

  static cudaError_t Run(const MlaDecodePlan& plan, MlaParams p, cudaStream_t stream) {
    p.ws = detail::CarvePlanWorkspace(const_cast<void*>(plan.workspace), plan.layout);
    p.total_items = static_cast<int>(plan.split.items.size());  // the counter is zero here
    p.chained = plan.split.spans ? 1 : 0;  // one-item plans take from the counter
    kKernel<<<plan.split.grid, kBlockThreads, kSmemBytes, stream>>>(p);
    if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
    return detail::LaunchMergePartials<kOutBf16, kMlaVDim>(
        p.ws, static_cast<int>(plan.split.merges.size()), plan.split.max_splits, p.num_heads, p.o,
        p.lse, !plan.plain_merge, stream);
  }
};

// The mma.sync kernel (16 or 32 heads per block).
template <typename KV, bool kQBf16, int kN, bool kTma>
using MlaLauncher = MlaKernelLauncher<MlaDecodeKernel<KV, kQBf16, kN, kTma>, kThreads,
                                      MlaConfig<KV, kN, kTma>::kSmemBytes, kQBf16>;

// 64 heads per block on wgmma (mla_decode_wgmma.cuh), bf16 or fp16 with tensor copies.
template <bool kBf16>
using MlaWgLauncher =
    MlaKernelLauncher<MlaWgmmaKernel<kBf16>, MlaWgConfig::kThreads, MlaWgConfig::kSmemBytes, kBf16>;

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

// A 3-D tensor map of `data` (dims and box innermost first, strides in bytes of the outer two),
// elements copied whole (no interleave, no out-of-bounds fill), 256-byte L2 promotion. False if
// the encoder is absent or refuses the description.
bool EncodeTensorMap3D(CUtensorMap* map, CUtensorMapDataType type, const void* data,
                       const cuuint64_t (&dims)[3], const cuuint64_t (&strides)[2],
                       const cuuint32_t (&box)[3], CUtensorMapSwizzle swizzle) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = TensorMapEncoder();
  if (encode == nullptr) return false;
  const cuuint32_t unit[3] = {1, 1, 1};
  return encode(map, type, 3, const_cast<void*>(data), dims, strides, box, unit,
                CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// The copy engine's type of 16-bit elements.
CUtensorMapDataType Tensor16(bool bf16) {
  return bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
}

// Describes the cache to the copy engine as [blocks][block_size][576] elements, boxes of
// [box_rows][64]. The block count is not known here and serves only bounds checks (the kernel
// never asks for a block outside the block tables), so it is set large.
bool EncodeKvMap(MlaParams& p, int eb, bool bf16) {
  const cuuint64_t dims[3] = {kMlaKDim, static_cast<cuuint64_t>(p.block_size), cuuint64_t{1} << 24};
  const cuuint64_t strides[2] = {cuuint64_t{kMlaKDim} * eb,
                                 static_cast<cuuint64_t>(p.block_stride)};
  const cuuint32_t box[3] = {64, static_cast<cuuint32_t>(p.box_rows), 1};
  return EncodeTensorMap3D(&p.kv_map, eb == 1 ? CU_TENSOR_MAP_DATA_TYPE_UINT8 : Tensor16(bf16),
                           p.kv, dims, strides, box,
                           eb == 1 ? CU_TENSOR_MAP_SWIZZLE_64B : CU_TENSOR_MAP_SWIZZLE_128B);
}

// Describes the query to the copy engine as [batch][num_heads][576] 16-bit elements, boxes of
// [64 heads][64], 128-byte swizzled: the wgmma kernel's query slabs.
bool EncodeQMap(MlaParams& p, bool bf16) {
  const cuuint64_t dims[3] = {kMlaKDim, static_cast<cuuint64_t>(p.num_heads),
                              static_cast<cuuint64_t>(p.batch)};
  const cuuint64_t strides[2] = {cuuint64_t{kMlaKDim} * 2,
                                 cuuint64_t{kMlaKDim} * 2 * static_cast<cuuint64_t>(p.num_heads)};
  const cuuint32_t box[3] = {64, 64, 1};
  return EncodeTensorMap3D(&p.q_map, Tensor16(bf16), p.q, dims, strides, box,
                           CU_TENSOR_MAP_SWIZZLE_128B);
}

template <bool kV>
using Bool = std::integral_constant<bool, kV>;

#if defined(KVPOOL_HAVE_WGMMA)
constexpr bool kHaveWgmma = true;  // built for sm_90a (cuda.cmake)
#else
constexpr bool kHaveWgmma = false;
#endif

// Calls f(Launcher{}) with the launcher of the kernel for these types, heads per block and copy
// kind; false where there is none (e4m3 at 32 heads per block has no tensor-copy build: it
// spilled registers and measured slower; 64 heads per block is the wgmma kernel: 16-bit caches,
// tensor copies, sm_90a).
template <typename F>
bool WithMlaLauncher(DType q_type, DType kv_type, int heads_per_block, bool tma, F&& f) {
  auto by_heads = [&](auto kv, auto qbf16) {
    using KV = decltype(kv);
    constexpr bool kQBf16 = decltype(qbf16)::value;
    constexpr bool kFp8 = std::is_same_v<KV, Fp8Tag>;
    if (heads_per_block == 16) {
      if (tma) {
        f(MlaLauncher<KV, kQBf16, 16, true>{});
      } else {
        f(MlaLauncher<KV, kQBf16, 16, false>{});
      }
      return true;
    }
    if (heads_per_block == 32) {
      if (!tma) {
        f(MlaLauncher<KV, kQBf16, 32, false>{});
        return true;
      }
      if constexpr (!kFp8) {
        f(MlaLauncher<KV, kQBf16, 32, true>{});
        return true;
      }
    }
    if (heads_per_block == 64 && tma && kHaveWgmma) {
      if constexpr (!kFp8) {
        f(MlaWgLauncher<kQBf16>{});
        return true;
      }
    }
    return false;
  };
  switch (kv_type) {
    case DType::kBF16:
      return q_type == DType::kBF16 && by_heads(Bf16Tag{}, Bool<true>{});
    case DType::kFP16:
      return q_type == DType::kFP16 && by_heads(Fp16Tag{}, Bool<false>{});
    case DType::kFP8E4M3:
      if (q_type == DType::kBF16) return by_heads(Fp8Tag{}, Bool<true>{});
      if (q_type == DType::kFP16) return by_heads(Fp8Tag{}, Bool<false>{});
      return false;
  }
  return false;
}

// The wgmma kernel's sm_90a code runs on compute capability 9.0 only (H100, H200).
bool IsSm90Device() {
  int dev = 0, major = 0, minor = 0;
  return cudaGetDevice(&dev) == cudaSuccess &&
         cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
         cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) == cudaSuccess &&
         major == 9 && minor == 0;
}

constexpr double kReadBytesPerUs = 4.6e6;  // the H200's read ceiling, for the cost model

struct MlaBasis {
  int heads_per_block = 0;
  bool tma = false;
  SplitPlanInput in;
};

KernelStatus MakeMlaBasis(const MlaDecodeShape& shape, DType q_type, DType kv_type,
                          const int32_t* host_seq_lens, int max_seq_len,
                          const MlaDecodeOptions& options, MlaBasis* basis) {
  if (KernelStatus st = MlaDecodeSupported(shape, q_type, kv_type); !st.ok()) return st;
  if (max_seq_len < 0) return KernelStatus::Refused("MlaDecode: max_seq_len is negative");
  const bool fp8 = kv_type == DType::kFP8E4M3;
  const bool tma_ok =
      !options.row_copies && shape.block_size % 16 == 0 && TensorMapEncoder() != nullptr;
  const bool wgmma_ok = kHaveWgmma && !fp8 && tma_ok && IsSm90Device();
  int hpb = options.heads_per_block;
  if (hpb == 0) {
    hpb = shape.num_heads % 64 == 0 && wgmma_ok ? 64 : (shape.num_heads % 32 == 0 ? 32 : 16);
  }
  if ((hpb != 16 && hpb != 32 && hpb != 64) || shape.num_heads % hpb != 0) {
    return KernelStatus::Refused("MlaDecode: " + std::to_string(hpb) +
                                 " heads per block (16, 32 or 64, dividing num_heads " +
                                 std::to_string(shape.num_heads) + ")");
  }
  if (hpb == 64 && !wgmma_ok) {
    return KernelStatus::Refused(
        "MlaDecode: 64 heads per block is the wgmma kernel: it needs a bf16 or fp16 cache, "
        "tensor copies (block_size a multiple of 16, no row_copies), a build for sm_90a and a "
        "compute capability 9.0 GPU");
  }
  const bool tma = tma_ok && !(fp8 && hpb == 32);
  int ctas = 0;
  WithMlaLauncher(q_type, kv_type, hpb, tma,
                  [&](auto launcher) { ctas = decltype(launcher)::ResidentCtas(); });
  if (ctas <= 0) {
    const cudaError_t e = cudaGetLastError();
    return {static_cast<int>(e == cudaSuccess ? cudaErrorInvalidConfiguration : e),
            std::string("MlaDecode: the kernel cannot run on this device (") +
                cudaGetErrorString(e) + ")"};
  }
  basis->heads_per_block = hpb;
  basis->tma = tma;
  SplitPlanInput& in = basis->in;
  in.batch = shape.batch;
  in.units_per_seq = shape.num_heads / hpb;
  in.seq_lens = host_seq_lens;
  in.max_seq_len = std::max(max_seq_len, 1);
  in.ctas = ctas;
  in.granule = kTileTokens;
  in.min_chunk = 256;
  in.granule_us = double{kTileTokens} * kMlaKDim * DTypeBytes(kv_type) * ctas / kReadBytesPerUs;
  in.item_us = 5.0;
  in.merge_us = 4.0;
  in.counter_us = 0.5;  // the atomic takes (the counter resets itself, no memset)
  in.max_slots = 2 * ctas;
  // Measured: 64 ragged sequences of 1k-16k at 16 heads took 277 us under the model's best plan
  // (141 items on 132 blocks) and 231 us under one of 128 items: the blocks left running speed
  // up when others finish, which the model does not see.
  in.one_wave = true;
  in.spans = !options.no_spans;
  in.force_spans = options.force_spans;
  in.forced_chunk = options.chunk;
  in.uniform = options.uniform;
  return KernelStatus::Ok();
}

}  // namespace

KernelStatus MlaDecodeSupported(const MlaDecodeShape& shape, DType q_type, DType kv_type) {
  auto refuse = [](const std::string& why) { return KernelStatus::Refused("MlaDecode: " + why); };
  if (shape.batch < 0) return refuse("negative batch");
  if (shape.num_heads <= 0 || shape.num_heads % 16 != 0) {
    return refuse("num_heads " + std::to_string(shape.num_heads) +
                  " is not a positive multiple of 16");
  }
  if (shape.block_size <= 0) return refuse("block_size must be positive");
  if (shape.block_stride < int64_t{shape.block_size} * kMlaKDim) {
    return refuse("block_stride is smaller than block_size * 576");
  }
  if ((shape.block_stride * DTypeBytes(kv_type)) % 16 != 0) {
    return refuse("block_stride must keep every block 16-byte aligned");
  }
  if (q_type == DType::kFP8E4M3) return refuse("queries cannot be e4m3 (bf16 or fp16)");
  if (kv_type != q_type && kv_type != DType::kFP8E4M3) {
    return refuse("the cache must have the query's type or be e4m3");
  }
  return KernelStatus::Ok();
}

size_t MlaDecodeWorkspaceBytes(const MlaDecodeShape& shape, DType q_type, DType kv_type,
                               int max_seq_len, const MlaDecodeOptions& options) {
  MlaBasis basis;
  if (!MakeMlaBasis(shape, q_type, kv_type, nullptr, max_seq_len, options, &basis).ok()) return 0;
  return DecodeWorkspaceBytes(basis.in, shape.num_heads, kMlaVDim);
}

KernelStatus PlanMlaDecode(const MlaDecodeShape& shape, DType q_type, DType kv_type,
                           const int32_t* host_seq_lens, int max_seq_len, void* workspace,
                           size_t workspace_bytes, cudaStream_t stream, MlaDecodePlan* plan,
                           const MlaDecodeOptions& options) {
  if (plan == nullptr) return KernelStatus::Refused("PlanMlaDecode: no plan to fill");
  *plan = MlaDecodePlan{};
  MlaBasis basis;
  if (KernelStatus st =
          MakeMlaBasis(shape, q_type, kv_type, host_seq_lens, max_seq_len, options, &basis);
      !st.ok()) {
    return st;
  }
  if (workspace == nullptr) return KernelStatus::Refused("PlanMlaDecode: no workspace");
  SplitPlanInput& in = basis.in;
  if (KernelStatus st =
          PlanSplitsInWorkspace("PlanMlaDecode", &in, shape.num_heads, kMlaVDim,
                                workspace_bytes, &plan->split, &plan->layout);
      !st.ok()) {
    return st;
  }
  plan->shape = shape;
  plan->q_type = q_type;
  plan->kv_type = kv_type;
  plan->max_seq_len = in.max_seq_len;
  plan->heads_per_block = basis.heads_per_block;
  plan->tma = basis.tma;
  plan->lazy_rescale = !options.eager_rescale && basis.heads_per_block == 64;
  plan->plain_merge = options.plain_merge;
  plan->workspace = workspace;
  if (cudaError_t e = detail::UploadPlan(plan->split, plan->layout, workspace, stream);
      e != cudaSuccess) {
    return {static_cast<int>(e), std::string("PlanMlaDecode: ") + cudaGetErrorString(e)};
  }
  return KernelStatus::Ok();
}

KernelStatus RunMlaDecode(const MlaDecodePlan& plan, const void* q, const void* kv_cache,
                          const int32_t* block_tables, const int32_t* seq_lens,
                          const AttentionScales& scales, void* o, float* lse, cudaStream_t stream) {
  const MlaDecodeShape& shape = plan.shape;
  if (shape.batch == 0) return KernelStatus::Ok();
  if (plan.workspace == nullptr) return KernelStatus::Refused("RunMlaDecode: the plan is empty");
  if ((reinterpret_cast<uintptr_t>(kv_cache) & 15) != 0 ||
      (reinterpret_cast<uintptr_t>(q) & 15) != 0 || (reinterpret_cast<uintptr_t>(o) & 15) != 0) {
    return KernelStatus::Refused("RunMlaDecode: q, o and kv_cache must be 16-byte aligned");
  }
  const int eb = DTypeBytes(plan.kv_type);
  MlaParams p{};
  p.q = q;
  p.kv = static_cast<const uint8_t*>(kv_cache);
  p.block_stride = shape.block_stride * eb;
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
  bool tma = plan.tma;
  p.lazy_rescale = plan.lazy_rescale ? 1 : 0;
  if (tma) {
    p.box_rows = p.block_size % 32 == 0 ? 32 : 16;
    if (plan.heads_per_block == 64 && p.block_size % 64 == 0) p.box_rows = 64;
    tma = EncodeKvMap(p, eb, plan.kv_type == DType::kBF16);
    if (!tma) {
      return KernelStatus::Refused("RunMlaDecode: the copy engine refused the cache's tensor map");
    }
    if (plan.heads_per_block == 64 && !EncodeQMap(p, plan.q_type == DType::kBF16)) {
      return KernelStatus::Refused("RunMlaDecode: the copy engine refused the query's tensor map");
    }
  }
  cudaError_t e = cudaSuccess;
  const bool found =
      WithMlaLauncher(plan.q_type, plan.kv_type, plan.heads_per_block, tma,
                      [&](auto launcher) { e = decltype(launcher)::Run(plan, p, stream); });
  if (!found) return KernelStatus::Refused("RunMlaDecode: the plan names no kernel");
  if (e != cudaSuccess) {
    return {static_cast<int>(e), std::string("RunMlaDecode: ") + cudaGetErrorString(e)};
  }
  return KernelStatus::Ok();
}

cudaError_t MlaDecode(const void* q, DType q_type, const void* kv_cache, DType kv_type,
                      const int32_t* block_tables, const int32_t* seq_lens, int max_seq_len,
                      const MlaDecodeShape& shape, const AttentionScales& scales, void* o,
                      float* lse, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  MlaDecodePlan plan;
  KernelStatus st = PlanMlaDecode(shape, q_type, kv_type, nullptr, max_seq_len, workspace,
                                  workspace_bytes, stream, &plan);
  if (st.ok()) st = RunMlaDecode(plan, q, kv_cache, block_tables, seq_lens, scales, o, lse, stream);
  return static_cast<cudaError_t>(st.cuda_error);
}

}  // namespace kvpool::kernels
