#pragma once

// MLA decode for 64 heads per block on Hopper's warpgroup MMA (wgmma), bf16 or fp16 caches.
// Included by mla_decode.cu only (it uses MlaParams and the planner there); 128 heads run as two
// head groups whose items are adjacent in the plan, so the second read of a tile mostly hits L2.
//
// Design (docs/kernels.md has the long form):
//  - One block per SM: two consumer warpgroups and a producer warpgroup (one warp of it copies;
//    it hands its registers to the consumers, 232 per thread). The producer takes work items
//    (sequence, 64 heads, tokens [start, end)) from the plan's counter and streams each 64-token
//    tile into one of two 72 KiB stages with tensor copies: nine [64 rows][64 values] column
//    slabs per stage, 128-byte swizzled, which is wgmma's canonical operand layout. It copies
//    each item's query the same way, into nine slabs of its own.
//  - Scores: warpgroup g computes S = Q K^T for the 64 heads (M) and tokens 32g .. 32g + 31 of
//    the tile (N = 32), K = 576 in 36 steps.
//  - Softmax: each warpgroup's row maxima go to shared memory; after a barrier of both groups
//    each knows the tile's maxima (identical in both), writes its probabilities (16-bit) into
//    the shared P tile [64 heads][64 tokens], and after a second barrier both compute
//    O[:, 256g .. 256g + 255] += P V over all 64 tokens (m64n256k16, V read MN-major straight
//    from the stage: no transposed copy). Each thread keeps 128 fp32 accumulators.
//  - Rows past a sequence's end are zeroed in the value columns (they may hold NaN), and their
//    scores masked, as in the mma.sync kernel.

#include "kernels/wgmma.cuh"

// Cycles per phase of the loops below, for kernels/tools/mla_phases.cu only: that file defines
// KVPOOL_MLA_PHASES and MlaPhaseMark before it includes mla_decode.cu. Elsewhere no code.
#ifdef KVPOOL_MLA_PHASES
#define KVPOOL_MLA_PHASE(i) MlaPhaseMark(i)
#else
#define KVPOOL_MLA_PHASE(i) ((void)0)
#endif

namespace kvpool::kernels {
namespace {

struct MlaWgConfig {
  static constexpr int kHeads = 64;         // wgmma's M
  static constexpr int kTile = 64;          // tokens per stage and tile
  static constexpr int kThreads = 3 * 128;  // two consumer warpgroups, one producer warpgroup
  static constexpr int kConsumerThreads = 256;
  static constexpr int kConsumerWarps = 8;
  static constexpr int kSlabs = kMlaKDim / 64;             // 9 column slabs of 128 bytes
  static constexpr int kSlabBytes = 64 * 128;              // [64 rows][128 B]
  static constexpr int kStageBytes = kSlabs * kSlabBytes;  // 72 KiB
  static constexpr int kStages = 2;
  static constexpr int kQOffset = kStages * kStageBytes;  // nine slabs of [64 heads][128 B]
  static constexpr int kPOffset = kQOffset + kSlabs * kSlabBytes;  // [64 heads][64 tokens]
  static constexpr int kMaxOffset = kPOffset + kSlabBytes;         // [2 groups][64 heads] floats
  static constexpr int kSumOffset = kMaxOffset + 2 * 64 * 4;
  static constexpr int kMetaOffset = kSumOffset + 2 * 64 * 4;
  // Barriers: full[kStages], empty[kStages], q full, q empty.
  static constexpr int kBarOffset = kMetaOffset + 16;
  static constexpr int kBarBytes = 8 * (2 * kStages + 2);
  static constexpr int kSmemBytes = kBarOffset + kBarBytes + 1024;  // + alignment slack
  static_assert(kSmemBytes <= 227 * 1024, "shared memory");
};

// Byte offset of 16-byte piece `piece` of row `row` in a 128-byte-swizzled slab.
__device__ __forceinline__ uint32_t Swz128(int row, int piece) {
  return row * 128 + 16 * (piece ^ (row & 7));
}

template <bool kBf16>
__global__ void __launch_bounds__(MlaWgConfig::kThreads, 1)
    MlaWgmmaKernel(const __grid_constant__ MlaParams p) {
  using C = MlaWgConfig;
  extern __shared__ __align__(128) uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024 - detail::SmemAddr(smem_raw) % 1024) % 1024);
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const uint32_t base = detail::SmemAddr(smem);
  const uint32_t full = base + C::kBarOffset;    // stage filled (one arrival + the bytes)
  const uint32_t empty = full + 8 * C::kStages;  // stage read by all eight consumer warps
  const uint32_t q_full = empty + 8 * C::kStages;  // an item's query copied (the bytes)
  const uint32_t q_empty = q_full + 8;  // the item's last scores done (every consumer warp)
  int* meta = reinterpret_cast<int*>(smem + C::kMetaOffset);
  if (threadIdx.x == 0) {
    for (int s = 0; s < C::kStages; ++s) {
      detail::MbarInit(full + 8 * s, 1);
      detail::MbarInit(empty + 8 * s, C::kConsumerWarps);
    }
    detail::MbarInit(q_full, 1);
    detail::MbarInit(q_empty, C::kConsumerWarps);
    detail::FenceBarrierInit();
  }
  detail::LaunchDependents();
  __syncthreads();

  if (warp >= C::kConsumerWarps) {
    // The producer warpgroup gives up its registers to the consumers (232 each, two
    // warpgroups: 2 x 128 x 232 + 128 x 40 <= 65536); one warp of it copies.
    detail::WarpgroupRegDealloc<40>();
    if (warp != C::kConsumerWarps) return;
    KVPOOL_MLA_PHASE(-1);
    // Producer, within MlaProduceItems' walk over the items: one stage per 64-token tile. Boxes
    // past the last token repeat the last valid box (the consumers zero those rows), so no table
    // entry beyond the sequence is read. After an item's first tile it copies the item's query
    // (nine slabs, like a stage) once the consumers are done with the previous one. A tile's
    // block-table entries are read before its stage is free, so their latency hides behind
    // that wait.
    uint32_t nq = 0;  // queries copied so far
    auto copy_item = [&](int cur, int4 wi, int end, int ntiles, auto&& take_stage) {
      KVPOOL_MLA_PHASE(2);
      const int b = wi.x;
      const int start = wi.z;
      const int32_t* table = p.block_tables + size_t{1} * b * p.max_blocks_per_seq;
      const int box = p.box_rows;  // 16, 32 or 64: lane i < 64 / box looks up box i of a tile
      const int last_box = (end - 1) / box * box;
      auto box_row = [&](int k, int i) { return min(start + k * C::kTile + i * box, last_box); };
      auto lookup = [&](int k) {
        return lane < C::kTile / box ? __ldg(table + box_row(k, lane) / p.block_size) : 0;
      };
      int blk_next = lookup(0);
      for (int k = 0; k < ntiles; ++k) {
        const int blk_lane = blk_next;
        if (k + 1 < ntiles) blk_next = lookup(k + 1);
        const uint32_t s = take_stage();
        KVPOOL_MLA_PHASE(0);
        if (lane == 0) {
          meta[s] = cur;
          detail::MbarArriveExpectTx(full + 8 * s, C::kTile * kMlaKDim * 2);
        }
#pragma unroll
        for (int i = 0; i < C::kTile / 16; ++i) {
          const int blk = __shfl_sync(0xffffffffu, blk_lane, i);
          if (lane == 0 && i < C::kTile / box) {
            const int t = box_row(k, i);
            const uint32_t dst = base + s * C::kStageBytes + i * box * 128;
#pragma unroll
            for (int j = 0; j < C::kSlabs; ++j) {
              detail::TmaLoad3D(dst + j * C::kSlabBytes, &p.kv_map, 64 * j, t % p.block_size, blk,
                                full + 8 * s);
            }
          }
        }
        if (k == 0) {
          if (nq > 0) detail::MbarWait(q_empty, (nq - 1) & 1);
          if (lane == 0) {
            detail::MbarArriveExpectTx(q_full, C::kHeads * kMlaKDim * 2);
#pragma unroll
            for (int j = 0; j < C::kSlabs; ++j) {
              detail::TmaLoad3D(base + C::kQOffset + j * C::kSlabBytes, &p.q_map, 64 * j,
                                wi.y * C::kHeads, b, q_full);
            }
          }
          ++nq;
        }
        __syncwarp();
        KVPOOL_MLA_PHASE(1);
      }
    };
    MlaProduceItems<C::kStages, 1, C::kTile>(p, full, empty, meta, lane, copy_item);
    KVPOOL_MLA_PHASE(-2);
    return;
  }

  detail::WarpgroupRegAlloc<232>();
  KVPOOL_MLA_PHASE(-1);
  // Consumers. Warpgroup wg, warp w4 in it: accumulator rows (heads) r0 = 16 w4 + lane / 4 and
  // r1 = r0 + 8; S columns (tokens 32 wg + ...) and O columns (value dims 256 wg + ...) 8j + 2q
  // and + 1 for n8-block j.
  const int wg = warp / 4;
  const int w4 = warp % 4;
  const int q4 = lane % 4;
  const int r0 = 16 * w4 + lane / 4, r1 = r0 + 8;
  const uint32_t qsm = base + C::kQOffset;
  const uint32_t psm = base + C::kPOffset;
  float* wmax = reinterpret_cast<float*>(smem + C::kMaxOffset);
  float* wsum = reinterpret_cast<float*>(smem + C::kSumOffset);
  constexpr int kBar = 1;
  constexpr uint32_t kSbo = 1024;  // 8 rows of 128 bytes

  uint32_t g = 0, nq = 0;
  while (true) {
    const uint32_t s0 = g % C::kStages;
    detail::MbarWait(full + 8 * s0, (g / C::kStages) & 1);
    KVPOOL_MLA_PHASE(0);
    const int item = meta[s0];
    if (item < 0) break;
    const int4 wi = *reinterpret_cast<const int4*>(p.ws.items + item);
    const int b = wi.x;
    const int start = wi.z;
    const int end = max(start, min(p.seq_lens[b], wi.w));
    const int ntiles = (end - start + C::kTile - 1) / C::kTile;
    const int head_base = wi.y * C::kHeads;

    // The query of these 64 heads, copied by the producer into nine swizzled slabs. The
    // barrier keeps the previous item's readers of the row sums ahead of this item's writers.
    if (ntiles > 0) {
      detail::MbarWait(q_full, nq & 1);
      ++nq;
    }
    detail::NamedBarrier(kBar, C::kConsumerThreads);
    KVPOOL_MLA_PHASE(1);

    float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};
    float o[128];
#pragma unroll
    for (int i = 0; i < 128; ++i) o[i] = 0.0f;

    if (ntiles == 0) {
      __syncwarp();
      if (lane == 0) detail::MbarArrive(empty + 8 * s0);
      ++g;
    }
    // 1. Waits for the stage of tile k (stage count gk), zeroes the value columns of its rows
    // past the end (0 x NaN would poison the output), and issues S = Q K^T for this group's 32
    // tokens into sc as one commit group.
    float sc[16];
    auto start_scores = [&](int k, uint32_t gk) {
      const uint32_t s = gk % C::kStages;
      detail::MbarWait(full + 8 * s, (gk / C::kStages) & 1);
      KVPOOL_MLA_PHASE(2);
      const uint32_t stage = base + s * C::kStageBytes;
      const int valid = end - (start + k * C::kTile);
      if (valid < C::kTile) {
        constexpr int kRowPieces = 8 * 8;  // slabs 0-7, 8 pieces each
        for (int i = threadIdx.x; i < (C::kTile - valid) * kRowPieces; i += C::kConsumerThreads) {
          const int row = valid + i / kRowPieces, piece = i % kRowPieces;
          detail::StShared16Zero(stage + (piece / 8) * C::kSlabBytes + Swz128(row, piece % 8));
        }
        detail::FenceProxyAsync();
        detail::NamedBarrier(kBar, C::kConsumerThreads);
      }
      detail::WgmmaFence();
#pragma unroll
      for (int ks = 0; ks < kMlaKDim / 16; ++ks) {
        const uint32_t off = (ks / 4) * C::kSlabBytes + (ks % 4) * 32;
        detail::WgmmaM64N32K16<kBf16>(sc, detail::WgmmaDesc(qsm + off, 16, kSbo),
                                      detail::WgmmaDesc(stage + off + wg * 32 * 128, 16, kSbo),
                                      ks > 0);
      }
      detail::WgmmaCommit();
      KVPOOL_MLA_PHASE(3);
    };
    const bool lazy = p.lazy_rescale != 0;
    for (int k = 0; k < ntiles; ++k) {
      const uint32_t s = g % C::kStages;
      const uint32_t stage = base + s * C::kStageBytes;
      const int valid = end - (start + k * C::kTile);
      start_scores(k, g);
      detail::WgmmaWait<0>();
      detail::WgmmaFenceOperands(sc);
      if (k == ntiles - 1) {  // the query's last reader in this warp
        __syncwarp();
        if (lane == 0) detail::MbarArrive(q_empty);
      }
      KVPOOL_MLA_PHASE(4);

      // 2. Scale and mask; row maxima of this group, then of the tile (both groups).
      float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int tok = 32 * wg + 8 * j + 2 * q4 + (e & 1);
          const float x = tok < valid ? sc[4 * j + e] * p.scale_log2 : -INFINITY;
          sc[4 * j + e] = x;
          mx[e >> 1] = fmaxf(mx[e >> 1], x);
        }
      }
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        mx[e] = fmaxf(mx[e], __shfl_xor_sync(0xffffffffu, mx[e], 1));
        mx[e] = fmaxf(mx[e], __shfl_xor_sync(0xffffffffu, mx[e], 2));
      }
      if (q4 == 0) {
        wmax[wg * 64 + r0] = mx[0];
        wmax[wg * 64 + r1] = mx[1];
      }
      KVPOOL_MLA_PHASE(5);
      detail::NamedBarrier(kBar, C::kConsumerThreads);
      KVPOOL_MLA_PHASE(6);
      float alpha[2], m_new[2];
      const int rows[2] = {r0, r1};
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        // Finite: token 0 of a tile is always valid. Lazy rescaling keeps the running maximum
        // unless the tile's exceeds it by more than 8 (log2 domain): the probabilities stay
        // below 2^8, and most tiles then leave O as it is (alpha 1). Both groups and the four
        // threads of a row decide alike (the same maxima).
        const float tile_max = fmaxf(mx[e], wmax[(1 - wg) * 64 + rows[e]]);
        const bool move = !lazy || tile_max > m_run[e] + 8.0f;  // always from -inf
        m_new[e] = move ? fmaxf(m_run[e], tile_max) : m_run[e];
        alpha[e] = exp2f(m_run[e] - m_new[e]);
        m_run[e] = m_new[e];
        l_run[e] *= alpha[e];
      }
      // 3. P (16-bit) into the shared tile: row = head, columns = the tile's 64 tokens.
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float p0 = exp2f(sc[4 * j] - m_new[0]), p1 = exp2f(sc[4 * j + 1] - m_new[0]);
        const float p2 = exp2f(sc[4 * j + 2] - m_new[1]), p3 = exp2f(sc[4 * j + 3] - m_new[1]);
        l_run[0] += p0 + p1;
        l_run[1] += p2 + p3;
        const int col = 32 * wg + 8 * j + 2 * q4;  // 16-bit column; piece col / 8
        *reinterpret_cast<uint32_t*>(smem + C::kPOffset + Swz128(r0, col / 8) + 2 * (col % 8)) =
            detail::PackFloat2<kBf16>(p0, p1);
        *reinterpret_cast<uint32_t*>(smem + C::kPOffset + Swz128(r1, col / 8) + 2 * (col % 8)) =
            detail::PackFloat2<kBf16>(p2, p3);
      }
      detail::FenceProxyAsync();
      KVPOOL_MLA_PHASE(7);
      detail::NamedBarrier(kBar, C::kConsumerThreads);  // P complete; maxima read by both
      KVPOOL_MLA_PHASE(8);

      // 4. O = O * alpha + P V over this group's 256 value dims (slabs 4 wg .. 4 wg + 3).
      if (!lazy || __any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) {
#pragma unroll
        for (int i = 0; i < 128; ++i) o[i] *= alpha[(i >> 1) & 1];
      }
      detail::WgmmaFence();
#pragma unroll
      for (int kk = 0; kk < C::kTile / 16; ++kk) {
        detail::WgmmaM64N256K16TransB<kBf16>(
            o, detail::WgmmaDesc(psm + kk * 32, 16, kSbo),
            detail::WgmmaDesc(stage + 4 * wg * C::kSlabBytes + kk * 16 * 128, C::kSlabBytes, kSbo));
      }
      detail::WgmmaCommit();
      KVPOOL_MLA_PHASE(9);
      detail::WgmmaWait<0>();
      detail::WgmmaFenceOperands(o);
      KVPOOL_MLA_PHASE(10);
      __syncwarp();
      if (lane == 0) detail::MbarArrive(empty + 8 * s);
      ++g;
    }

    // Row sums: this thread's columns, its quad, then both groups. The barrier also ends every
    // reader of the query and of P for this item.
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      l_run[e] += __shfl_xor_sync(0xffffffffu, l_run[e], 1);
      l_run[e] += __shfl_xor_sync(0xffffffffu, l_run[e], 2);
    }
    if (q4 == 0) {
      wsum[wg * 64 + r0] = l_run[0];
      wsum[wg * 64 + r1] = l_run[1];
    }
    detail::NamedBarrier(kBar, C::kConsumerThreads);
    float inv[2], lse[2];
    {
      const float ls[2] = {wsum[r0] + wsum[64 + r0], wsum[r1] + wsum[64 + r1]};
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        inv[e] = ls[e] > 0.0f ? p.v_scale / ls[e] : 0.0f;
        lse[e] = ls[e] > 0.0f ? (m_run[e] + __log2f(ls[e])) * detail::kLn2 : -INFINITY;
      }
    }
    // The next item's first write of wsum comes after its query barrier, which every thread
    // reaches after reading the sums here.

    const int slot = __ldg(&p.ws.items[item].slot);
    const int heads[2] = {head_base + r0, head_base + r1};
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      const int d = 256 * wg + 8 * j + 2 * q4;
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float v0 = o[4 * j + 2 * e] * inv[e], v1 = o[4 * j + 2 * e + 1] * inv[e];
        if (slot < 0) {
          uint16_t* out =
              static_cast<uint16_t*>(p.o) + (size_t{1} * b * p.num_heads + heads[e]) * kMlaVDim + d;
          *reinterpret_cast<uint32_t*>(out) = detail::PackFloat2<kBf16>(v0, v1);
        } else {
          const size_t row = size_t{1} * slot * p.num_heads + heads[e];
          *reinterpret_cast<float2*>(p.ws.part_o + row * kMlaVDim + d) = make_float2(v0, v1);
        }
      }
    }
    if (wg == 0 && q4 == 0) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        if (slot < 0) {
          if (p.lse != nullptr) p.lse[size_t{1} * b * p.num_heads + heads[e]] = lse[e];
        } else {
          p.ws.part_lse[size_t{1} * slot * p.num_heads + heads[e]] = lse[e];
        }
      }
    }
    KVPOOL_MLA_PHASE(11);
  }
  KVPOOL_MLA_PHASE(-2);
}

}  // namespace
}  // namespace kvpool::kernels
