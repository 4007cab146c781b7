#pragma once

// MLA decode for 64 heads per block on wgmma with the two consumer warpgroups out of step
// (opt-in: MlaDecodeOptions::seesaw). Included by mla_decode.cu only, after
// mla_decode_wgmma.cuh (its producer, Swz128).
//
// Design (docs/kernels.md, "Opt-in variants"):
//  - Stages of 32 tokens (nine [32 rows][128 B] slabs, 36 KiB), four of them: a pair of tiles
//    is read while the next pair is copied. The query as in MlaWgmmaKernel.
//  - An item's tiles go in pairs (A, B). Warpgroup 0 computes A's scores (m64n32, K = 576) and
//    their softmax, warpgroup 1 B's. Each warpgroup keeps O for its 256 value dims and adds both
//    P_A V_A and P_B V_B to it. The running maximum passes from A's softmax to B's and on to the
//    next A's through shared memory, with the factor each one rescales O by; named barriers
//    (A ready, B ready, P free) order the two warpgroups, so one's softmax runs while the other's
//    MMAs do, where MlaWgmmaKernel's groups wait for each other at every tile.
//  - P of a pair is one [64 heads][64 tokens] tile: A's probabilities in the first 64 bytes of
//    each row, B's in the last.
//  - Row sums stay per warpgroup (each over its own tiles, rescaled by every factor) and are
//    added at the item's end. Rows past a sequence's end are zeroed in the value columns by the
//    warpgroup that owns the tile, before its scores, and their scores masked.

namespace kvpool::kernels {
namespace {

struct MlaSeesawConfig {
  static constexpr int kHeads = 64;
  static constexpr int kTile = 32;  // tokens per stage and tile
  static constexpr int kThreads = 3 * 128;
  static constexpr int kConsumerThreads = 256;
  static constexpr int kConsumerWarps = 8;
  static constexpr int kSlabs = kMlaKDim / 64;
  static constexpr int kSlabBytes = kTile * 128;           // [32 rows][128 B]
  static constexpr int kStageBytes = kSlabs * kSlabBytes;  // 36 KiB
  static constexpr int kStages = 4;
  static constexpr int kQSlabBytes = kHeads * 128;  // [64 heads][128 B]
  static constexpr int kQOffset = kStages * kStageBytes;
  static constexpr int kPOffset = kQOffset + kSlabs * kQSlabBytes;  // [64 heads][64 tokens]
  static constexpr int kPassOffset = kPOffset + kQSlabBytes;        // [2 directions][2][64] floats
  static constexpr int kSumOffset = kPassOffset + 2 * 2 * 64 * 4;   // [2 groups][64] floats
  static constexpr int kMetaOffset = kSumOffset + 2 * 64 * 4;
  static constexpr int kBarOffset = kMetaOffset + 4 * kStages;
  static constexpr int kSmemBytes = kBarOffset + 16 * kStages + 1024;  // + alignment slack
  static_assert(kSmemBytes <= 227 * 1024, "shared memory");
  static_assert(kBarOffset % 8 == 0, "mbarriers are 8-byte aligned");
};

template <bool kBf16>
__global__ void __launch_bounds__(MlaSeesawConfig::kThreads, 1)
    MlaSeesawKernel(const __grid_constant__ MlaParams p) {
  using C = MlaSeesawConfig;
  extern __shared__ __align__(128) uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024 - detail::SmemAddr(smem_raw) % 1024) % 1024);
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const uint32_t base = detail::SmemAddr(smem);
  const uint32_t full = base + C::kBarOffset;
  const uint32_t empty = full + 8 * C::kStages;
  int* meta = reinterpret_cast<int*>(smem + C::kMetaOffset);
  if (threadIdx.x == 0) {
    for (int s = 0; s < C::kStages; ++s) {
      detail::MbarInit(full + 8 * s, 1);
      detail::MbarInit(empty + 8 * s, C::kConsumerWarps);
    }
    detail::FenceBarrierInit();
  }
  detail::LaunchDependents();
  __syncthreads();

  if (warp >= C::kConsumerWarps) {
    detail::WarpgroupRegDealloc<40>();
    if (warp != C::kConsumerWarps) return;
    MlaTmaProducer<C>(p, base, full, empty, meta, lane);
    return;
  }

  detail::WarpgroupRegAlloc<232>();
  // Warpgroup wg, warp w4 in it: accumulator rows (heads) r0 = 16 w4 + lane / 4 and r1 = r0 + 8;
  // S columns (the tile's tokens) and O columns (value dims 256 wg + ...) 8j + 2q and + 1.
  // Warp-uniform by construction (a shuffle from lane 0), so that ptxas sees the two
  // warpgroups' branches as uniform and keeps their wgmmas asynchronous.
  const int wg = __shfl_sync(0xffffffffu, warp / 4, 0);
  const int w4 = warp % 4;
  const int q4 = lane % 4;
  const int r0 = 16 * w4 + lane / 4, r1 = r0 + 8;
  const int rows[2] = {r0, r1};
  const uint32_t qsm = base + C::kQOffset;
  const uint32_t psm = base + C::kPOffset;
  // pass[d][0][row]: the running max after the tile, pass[d][1][row]: the factor O is rescaled
  // by; d = 0 from A's softmax (warpgroup 0), d = 1 from B's (warpgroup 1).
  float* pass = reinterpret_cast<float*>(smem + C::kPassOffset);
  float* wsum = reinterpret_cast<float*>(smem + C::kSumOffset);
  constexpr int kBarAll = 1;       // both consumer warpgroups
  constexpr int kBarAReady = 2;    // A's P and pass[0] written (warpgroup 0 arrives)
  constexpr int kBarBReady = 3;    // B's P and pass[1] written (warpgroup 1 arrives)
  constexpr int kBarPFree = 4;     // warpgroup 1's P_A V_A done: A's half of P may be rewritten
  const int bar_group = 5 + wg;    // this warpgroup alone
  constexpr uint32_t kSbo = 1024;  // 8 rows of 128 bytes

  auto release = [&](uint32_t stage_count) {
    __syncwarp();
    if (lane == 0) detail::MbarArrive(empty + 8 * (stage_count % C::kStages));
  };
  auto wait_full = [&](uint32_t stage_count) {
    detail::MbarWait(full + 8 * (stage_count % C::kStages), (stage_count / C::kStages) & 1);
  };
  auto stage_at = [&](uint32_t stage_count) {
    return base + (stage_count % C::kStages) * C::kStageBytes;
  };
  // Zeroes the value columns of rows [valid, kTile) of a stage (they may hold NaN, and 0 x NaN
  // would poison O) and issues this warpgroup's S = Q K^T over the stage as one commit group.
  float sc[16];
  auto issue_scores = [&](uint32_t stage, int valid) {
    if (valid < C::kTile) {
      constexpr int kRowPieces = 8 * 8;  // slabs 0-7, 8 pieces each
      for (int i = threadIdx.x % 128; i < (C::kTile - valid) * kRowPieces; i += 128) {
        const int row = valid + i / kRowPieces, piece = i % kRowPieces;
        detail::StShared16Zero(stage + (piece / 8) * C::kSlabBytes + Swz128(row, piece % 8));
      }
      detail::FenceProxyAsync();
      detail::NamedBarrier(bar_group, 128);
    }
    detail::WgmmaFence();
#pragma unroll
    for (int ks = 0; ks < kMlaKDim / 16; ++ks) {
      const uint32_t kq = (ks / 4) * C::kQSlabBytes + (ks % 4) * 32;
      const uint32_t kk = (ks / 4) * C::kSlabBytes + (ks % 4) * 32;
      detail::WgmmaM64N32K16<kBf16>(sc, detail::WgmmaDesc(qsm + kq, 16, kSbo),
                                    detail::WgmmaDesc(stage + kk, 16, kSbo), ks > 0);
    }
    detail::WgmmaCommit();
  };
  // Softmax of this warpgroup's finished scores (tokens below `valid`) against the running max
  // m_run: writes P into half `half` of the P tile and pass[half]; returns the rescale factors.
  float l_mine[2] = {0.0f, 0.0f};
  float m_run[2] = {-INFINITY, -INFINITY};
  auto softmax = [&](int valid, int half, float(&alpha)[2]) {
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int tok = 8 * j + 2 * q4 + (e & 1);
        const float x = tok < valid ? sc[4 * j + e] * p.scale_log2 : -INFINITY;
        sc[4 * j + e] = x;
        mx[e >> 1] = fmaxf(mx[e >> 1], x);
      }
    }
    float m_new[2];
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      mx[e] = fmaxf(mx[e], __shfl_xor_sync(0xffffffffu, mx[e], 1));
      mx[e] = fmaxf(mx[e], __shfl_xor_sync(0xffffffffu, mx[e], 2));
      m_new[e] = fmaxf(m_run[e], mx[e]);  // finite: token 0 of a tile is always valid
      alpha[e] = exp2f(m_run[e] - m_new[e]);
      l_mine[e] *= alpha[e];
      m_run[e] = m_new[e];
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float p0 = exp2f(sc[4 * j] - m_new[0]), p1 = exp2f(sc[4 * j + 1] - m_new[0]);
      const float p2 = exp2f(sc[4 * j + 2] - m_new[1]), p3 = exp2f(sc[4 * j + 3] - m_new[1]);
      l_mine[0] += p0 + p1;
      l_mine[1] += p2 + p3;
      const int col = 32 * half + 8 * j + 2 * q4;  // 16-bit column; piece col / 8
      *reinterpret_cast<uint32_t*>(smem + C::kPOffset + Swz128(r0, col / 8) + 2 * (col % 8)) =
          detail::PackFloat2<kBf16>(p0, p1);
      *reinterpret_cast<uint32_t*>(smem + C::kPOffset + Swz128(r1, col / 8) + 2 * (col % 8)) =
          detail::PackFloat2<kBf16>(p2, p3);
    }
    if (q4 == 0) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        pass[(2 * half) * 64 + rows[e]] = m_new[e];
        pass[(2 * half + 1) * 64 + rows[e]] = alpha[e];
      }
    }
    detail::FenceProxyAsync();  // P is read by wgmma (the async proxy)
  };
  // The other warpgroup's softmax of half `half`: its running max and factor.
  auto take_pass = [&](int half, float(&alpha)[2]) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      m_run[e] = pass[(2 * half) * 64 + rows[e]];
      alpha[e] = pass[(2 * half + 1) * 64 + rows[e]];
      l_mine[e] *= alpha[e];
    }
  };
  float o[128];
  auto rescale = [&](const float(&alpha)[2]) {
#pragma unroll
    for (int i = 0; i < 128; ++i) o[i] *= alpha[(i >> 1) & 1];
  };
  // O[:, 256 wg ..] += P_half V over the stage's 32 tokens, as one commit group.
  auto issue_pv = [&](uint32_t stage, int half) {
    detail::WgmmaFenceOperands(o);  // the rescale's products stay before the fence
    detail::WgmmaFence();
#pragma unroll
    for (int kk = 0; kk < C::kTile / 16; ++kk) {
      detail::WgmmaM64N256K16TransB<kBf16>(
          o, detail::WgmmaDesc(psm + (2 * half + kk) * 32, 16, kSbo),
          detail::WgmmaDesc(stage + 4 * wg * C::kSlabBytes + kk * 16 * 128, C::kSlabBytes, kSbo));
    }
    detail::WgmmaCommit();
  };

  uint32_t g = 0;      // stages taken
  uint32_t pairs = 0;  // pairs done, over all items (warpgroup 0 waits for P free from the 2nd)
  while (true) {
    wait_full(g);
    const int item = meta[g % C::kStages];
    if (item < 0) break;
    const int4 wi = *reinterpret_cast<const int4*>(p.ws.items + item);
    const int b = wi.x;
    const int start = wi.z;
    const int end = max(start, min(p.seq_lens[b], wi.w));
    const int ntiles = (end - start + C::kTile - 1) / C::kTile;
    const int head_base = wi.y * C::kHeads;

    // The query of these 64 heads into nine swizzled slabs. Every reader of the previous item's
    // query passed the barrier at its end.
    if (ntiles > 0) {
      const uint4* qg = reinterpret_cast<const uint4*>(
          static_cast<const uint16_t*>(p.q) + (size_t{1} * b * p.num_heads + head_base) * kMlaKDim);
      constexpr int kPieces = C::kHeads * kMlaKDim / 8;  // 16-byte pieces
      for (int i = threadIdx.x; i < kPieces; i += C::kConsumerThreads) {
        const int head = i / (kMlaKDim / 8), c = i % (kMlaKDim / 8);
        *reinterpret_cast<uint4*>(smem + C::kQOffset + (c / 8) * C::kQSlabBytes +
                                  Swz128(head, c % 8)) = __ldg(qg + i);
      }
      detail::FenceProxyAsync();
    }
    detail::NamedBarrier(kBarAll, C::kConsumerThreads);

    m_run[0] = m_run[1] = -INFINITY;
    l_mine[0] = l_mine[1] = 0.0f;
#pragma unroll
    for (int i = 0; i < 128; ++i) o[i] = 0.0f;
    if (ntiles == 0) {
      release(g);
      ++g;
    }
    // A stage whose P V of this warpgroup is still in flight, released after its wait.
    bool pending = false;
    uint32_t pending_g = 0;
    for (int k = 0; k < ntiles; k += 2) {
      const bool has_b = k + 1 < ntiles;
      const uint32_t ga = g + k, gb = ga + 1;
      const int valid_a = end - (start + k * C::kTile);  // may exceed kTile
      float alpha[2];
      if (wg == 0) {
        wait_full(ga);
        issue_scores(stage_at(ga), valid_a);
        detail::WgmmaWait<0>();  // the scores, and the previous pair's P_B V_B
        detail::WgmmaFenceOperands(sc);
        detail::WgmmaFenceOperands(o);
        if (pending) release(pending_g);
        pending = false;
        if (pairs > 0) detail::NamedBarrier(kBarPFree, C::kConsumerThreads);
        softmax(valid_a, 0, alpha);
        detail::NamedBarrierArrive(kBarAReady, C::kConsumerThreads);
        rescale(alpha);
        issue_pv(stage_at(ga), 0);
        if (has_b) {
          detail::NamedBarrier(kBarBReady, C::kConsumerThreads);
          wait_full(gb);  // complete already: the other group waited; orders the copy for us
          take_pass(1, alpha);
          detail::WgmmaWait<0>();
          detail::WgmmaFenceOperands(o);
          release(ga);
          rescale(alpha);
          issue_pv(stage_at(gb), 1);
          pending = true;
          pending_g = gb;
        } else {
          detail::WgmmaWait<0>();
          detail::WgmmaFenceOperands(o);
          release(ga);
        }
      } else {
        // Warpgroup 1. The previous pair's P_B V_B ends first. The two paths are written out
        // whole: a wait whose groups differ between paths makes ptxas serialize every wgmma.
        detail::WgmmaWait<0>();
        detail::WgmmaFenceOperands(o);
        if (pending) release(pending_g);
        pending = false;
        if (has_b) {
          wait_full(gb);
          issue_scores(stage_at(gb), valid_a - C::kTile);
          detail::NamedBarrier(kBarAReady, C::kConsumerThreads);
          wait_full(ga);
          take_pass(0, alpha);
          rescale(alpha);
          issue_pv(stage_at(ga), 0);
          detail::WgmmaWait<1>();  // B's scores (committed before P_A V_A)
          detail::WgmmaFenceOperands(sc);
          softmax(valid_a - C::kTile, 1, alpha);
          detail::NamedBarrierArrive(kBarBReady, C::kConsumerThreads);
          detail::WgmmaWait<0>();
          detail::WgmmaFenceOperands(o);
          detail::NamedBarrierArrive(kBarPFree, C::kConsumerThreads);
          release(ga);
          rescale(alpha);
          issue_pv(stage_at(gb), 1);
          pending = true;
          pending_g = gb;
        } else {
          detail::NamedBarrier(kBarAReady, C::kConsumerThreads);
          wait_full(ga);
          take_pass(0, alpha);
          rescale(alpha);
          issue_pv(stage_at(ga), 0);
          detail::WgmmaWait<0>();
          detail::WgmmaFenceOperands(o);
          detail::NamedBarrierArrive(kBarPFree, C::kConsumerThreads);
          release(ga);
        }
      }
      ++pairs;
    }
    detail::WgmmaWait<0>();
    detail::WgmmaFenceOperands(o);
    if (pending) release(pending_g);
    g += ntiles;

    // Row sums: this thread's columns, its quad, then both groups. The barrier also ends every
    // reader of the query, of P and of pass for this item.
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      l_mine[e] += __shfl_xor_sync(0xffffffffu, l_mine[e], 1);
      l_mine[e] += __shfl_xor_sync(0xffffffffu, l_mine[e], 2);
    }
    if (q4 == 0) {
      wsum[wg * 64 + r0] = l_mine[0];
      wsum[wg * 64 + r1] = l_mine[1];
    }
    detail::NamedBarrier(kBarAll, C::kConsumerThreads);
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
  }
  // Warpgroup 1 arrived at P free after every pair; the last arrival is taken here, so the
  // barrier is left as it started.
  if (wg == 0 && pairs > 0) detail::NamedBarrier(kBarPFree, C::kConsumerThreads);
}

}  // namespace
}  // namespace kvpool::kernels
