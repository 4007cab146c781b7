// Where the wgmma MLA kernel's time goes: cycles per phase of its loops, from clock64() marks
// that only this build compiles (KVPOOL_MLA_PHASE in mla_decode_wgmma.cuh), summed by the first
// thread of each warpgroup over every block; and the rate of the wgmma shapes it issues, alone
// and from two warpgroups at once. A measuring tool for kernels/run_on_gpu.sh ("phases"), not
// part of the library: it compiles its own copy of mla_decode.cu.
//
//   kvpool-mla-phases [heads:batch:len ...]   (default: the rows of docs/benchmarks.md)

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "kernels/testing/cuda_ok.h"

#define KVPOOL_MLA_PHASES 1

namespace {
constexpr int kPhaseSlots = 16;  // 0-12 phases, 14 items, 15 tiles
__device__ unsigned long long g_phases[3][kPhaseSlots];  // consumer groups 0 and 1, producer
}  // namespace

// i >= 0: the cycles since the previous mark go to phase i; -1: start; -2: add this block's sums
// to g_phases. Only the first thread of each warpgroup counts (defined below).
__device__ __forceinline__ void MlaPhaseMark(int i);

#include "kernels/mla_decode.cu"

// The sums live in the kernel's 1024 bytes of alignment slack, after its barriers (no static
// shared memory: the kernel's dynamic allocation is at the 227 KiB limit).
__device__ __forceinline__ void MlaPhaseMark(int i) {
  if (threadIdx.x % 128 != 0) return;
  using C = kvpool::kernels::MlaWgConfig;
  extern __shared__ __align__(128) uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024 - kvpool::kernels::detail::SmemAddr(smem_raw) % 1024) % 1024);
  auto* acc =
      reinterpret_cast<unsigned long long(*)[kPhaseSlots]>(smem + C::kBarOffset + C::kBarBytes);
  auto* last = reinterpret_cast<long long*>(acc + 3);
  constexpr int kUsed = C::kBarOffset + C::kBarBytes + (3 * kPhaseSlots + 3) * 8;
  static_assert(kUsed <= C::kSmemBytes, "the sums fit in the slack");
  if (smem + kUsed > smem_raw + C::kSmemBytes) return;  // the alignment took the slack
  const int wg = threadIdx.x / 128;
  const long long t = clock64();
  if (i == -1) {
    for (int j = 0; j < kPhaseSlots; ++j) acc[wg][j] = 0;
  } else if (i == -2) {
    for (int j = 0; j < kPhaseSlots; ++j) atomicAdd(&g_phases[wg][j], acc[wg][j]);
  } else {
    acc[wg][i] += static_cast<unsigned long long>(t - last[wg]);
    const bool tile_end = wg < 2 ? i == 10 : i == 1;
    const bool item_end = wg < 2 ? i == 11 : i == 2;
    if (tile_end) ++acc[wg][15];
    if (item_end) ++acc[wg][14];
  }
  last[wg] = clock64();  // the bookkeeping above is not charged to the next phase
}

namespace {

using kvpool::kernels::AttentionScales;
using kvpool::kernels::DType;
using kvpool::kernels::kMlaKDim;
using kvpool::kernels::kMlaVDim;
using kvpool::kernels::MlaDecodePlan;
using kvpool::kernels::MlaDecodeShape;

const char* const kConsumerPhases[13] = {
    "wait for an item's first stage", "wait for the query + barrier",
    "wait for the tile's stage",      "S: issue 36 wgmma (m64n32k16)",
    "S: wait",                        "scale, mask, row max",
    "barrier: maxima",                "alpha, P into shared memory",
    "barrier: P",                     "rescale O, issue P V (4 x m64n256k16)",
    "P V: wait",                      "epilogue (row sums, barrier, stores)",
    "(unused)"};
const char* const kProducerPhases[3] = {"wait for an empty stage", "issue the tile's copies",
                                        "next item"};

void RunRow(int heads, int batch, int len) {
  constexpr int kBlock = 64;
  const int bps = (len + kBlock - 1) / kBlock;
  const int num_blocks = batch * bps;
  const MlaDecodeShape shape{batch, heads, kBlock, bps, int64_t{kBlock} * kMlaKDim};
  std::mt19937 rng(1);
  std::uniform_int_distribution<int> bits(0x3c00, 0x3e00);  // bf16 in [0.0078, 0.125] or so
  std::vector<uint16_t> hq(size_t{1} * batch * heads * kMlaKDim);
  std::vector<uint16_t> hkv(size_t{1} * num_blocks * kBlock * kMlaKDim);
  for (auto& v : hq) v = static_cast<uint16_t>(bits(rng));
  for (auto& v : hkv) v = static_cast<uint16_t>(bits(rng));
  std::vector<int32_t> table(size_t{1} * batch * bps), lens(batch, len);
  for (size_t i = 0; i < table.size(); ++i) table[i] = static_cast<int32_t>(i);
  void *q, *kv, *o, *ws;
  int32_t *dtable, *dlens;
  CUDA_OK(cudaMalloc(&q, hq.size() * 2));
  CUDA_OK(cudaMalloc(&kv, hkv.size() * 2));
  CUDA_OK(cudaMalloc(&o, size_t{1} * batch * heads * kMlaVDim * 2));
  CUDA_OK(cudaMalloc(&dtable, table.size() * 4));
  CUDA_OK(cudaMalloc(&dlens, lens.size() * 4));
  CUDA_OK(cudaMemcpy(q, hq.data(), hq.size() * 2, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(kv, hkv.data(), hkv.size() * 2, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(dtable, table.data(), table.size() * 4, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(dlens, lens.data(), lens.size() * 4, cudaMemcpyHostToDevice));
  const size_t ws_bytes =
      kvpool::kernels::MlaDecodeWorkspaceBytes(shape, DType::kBF16, DType::kBF16, len);
  CUDA_OK(cudaMalloc(&ws, ws_bytes));
  MlaDecodePlan plan;
  const auto st = kvpool::kernels::PlanMlaDecode(shape, DType::kBF16, DType::kBF16, lens.data(),
                                                 len, ws, ws_bytes, nullptr, &plan);
  if (!st.ok() || plan.heads_per_block != 64) {
    std::printf("%d heads, %d x %d: no wgmma plan (%s)\n", heads, batch, len, st.reason.c_str());
    return;
  }
  const AttentionScales scales{0.0417f, 1.0f, 1.0f};
  auto run = [&] {
    const auto rs = kvpool::kernels::RunMlaDecode(plan, q, kv, dtable, dlens, scales, o, nullptr,
                                                  nullptr);
    if (!rs.ok()) {
      std::fprintf(stderr, "run failed: %s\n", rs.reason.c_str());
      std::exit(1);
    }
  };
  for (int i = 0; i < 3; ++i) run();
  CUDA_OK(cudaDeviceSynchronize());
  unsigned long long zero[3][kPhaseSlots] = {};
  CUDA_OK(cudaMemcpyToSymbol(g_phases, zero, sizeof(zero)));
  constexpr int kReps = 10;
  cudaEvent_t e0, e1;
  CUDA_OK(cudaEventCreate(&e0));
  CUDA_OK(cudaEventCreate(&e1));
  CUDA_OK(cudaEventRecord(e0));
  for (int i = 0; i < kReps; ++i) run();
  CUDA_OK(cudaEventRecord(e1));
  CUDA_OK(cudaEventSynchronize(e1));
  float ms = 0;
  CUDA_OK(cudaEventElapsedTime(&ms, e0, e1));
  unsigned long long ph[3][kPhaseSlots];
  CUDA_OK(cudaMemcpyFromSymbol(ph, g_phases, sizeof(ph)));
  int sm_khz = 0;
  CUDA_OK(cudaDeviceGetAttribute(&sm_khz, cudaDevAttrClockRate, 0));
  std::printf("\n### %d heads, %d x %d: %.1f us per launch (with the marks), %zu items, grid %d\n",
              heads, batch, len, 1000.0 * ms / kReps, plan.split.items.size(), plan.split.grid);
  std::printf("tiles per warpgroup leader: %llu / %llu (producer %llu); items %llu\n", ph[0][15],
              ph[1][15], ph[2][15], ph[0][14]);
  std::printf("| phase | group 0 cycles per tile | group 1 |\n| --- | ---: | ---: |\n");
  double tot[2] = {0, 0};
  for (int i = 0; i < 12; ++i) {
    double c[2];
    for (int g = 0; g < 2; ++g) {
      c[g] = ph[g][15] ? static_cast<double>(ph[g][i]) / ph[g][15] : 0;
      tot[g] += c[g];
    }
    std::printf("| %s | %.0f | %.0f |\n", kConsumerPhases[i], c[0], c[1]);
  }
  std::printf("| total | %.0f | %.0f |\n", tot[0], tot[1]);
  std::printf("| producer phase | cycles per tile |\n| --- | ---: |\n");
  for (int i = 0; i < 3; ++i) {
    std::printf("| %s | %.0f |\n", kProducerPhases[i],
                ph[2][15] ? static_cast<double>(ph[2][i]) / ph[2][15] : 0);
  }
  std::printf("(clock rate attribute %d MHz; a 64-token tile's bytes at 1 / 132 of 3.2 TB/s: "
              "%.0f cycles at that clock)\n",
              sm_khz / 1000, 64.0 * 1152 / (3.2e12 / 132) * sm_khz * 1e3);
  cudaFree(q);
  cudaFree(kv);
  cudaFree(o);
  cudaFree(ws);
  cudaFree(dtable);
  cudaFree(dlens);
}

// --- wgmma rates: chains of one shape from one or two warpgroups per block, one block per SM.

__device__ __forceinline__ void WgmmaM64N64K16(float (&d)[32], uint64_t a, uint64_t b) {
#if KVPOOL_WGMMA_DEVICE
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, "
      "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, "
      "0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]),
        "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]),
        "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(a), "l"(b), "r"(1));
#else
  __trap();
#endif
}

// kMode 0: 36 x m64n32k16 (the scores as now); 1: 36 x m64n64k16; 2: 4 x m64n256k16 (P V).
// Dynamic shared memory: 160 KiB (one block per SM), contents irrelevant to the rate.
template <int kMode>
__global__ void __launch_bounds__(256, 1) WgmmaRateKernel(int iters, long long* cycles,
                                                          float* sink) {
  constexpr int mode = kMode;
  extern __shared__ __align__(1024) uint8_t smem[];
  const uint32_t base = kvpool::kernels::detail::SmemAddr(smem);
  const uint32_t a = (base + 1023) / 1024 * 1024, b = a + 73728;
  const int wg = threadIdx.x / 128;
  float acc[128] = {};
  float s32[16] = {}, s64[32] = {};
  namespace d = kvpool::kernels::detail;
  long long t0 = 0;
  for (int it = -2; it < iters; ++it) {
    if (it == 0) t0 = clock64();
    d::WgmmaFence();
    if constexpr (mode == 0) {
#pragma unroll
      for (int ks = 0; ks < 36; ++ks) {
        const uint32_t off = (ks / 4) * 8192 + (ks % 4) * 32;
        d::WgmmaM64N32K16<true>(s32, d::WgmmaDesc(a + off, 16, 1024),
                                d::WgmmaDesc(b + off + wg * 32 * 128, 16, 1024), 1);
      }
    } else if constexpr (mode == 1) {
#pragma unroll
      for (int ks = 0; ks < 36; ++ks) {
        const uint32_t off = (ks / 4) * 8192 + (ks % 4) * 32;
        WgmmaM64N64K16(s64, d::WgmmaDesc(a + off, 16, 1024), d::WgmmaDesc(b + off, 16, 1024));
      }
    } else {
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        d::WgmmaM64N256K16TransB<true>(acc, d::WgmmaDesc(a + kk * 32, 16, 1024),
                                       d::WgmmaDesc(b + 4 * wg * 8192 + kk * 16 * 128, 8192, 1024));
      }
    }
    d::WgmmaCommit();
    d::WgmmaWait<0>();
    d::WgmmaFenceOperands(acc);
    d::WgmmaFenceOperands(s32);
    d::WgmmaFenceOperands(s64);
  }
  const long long t1 = clock64();
  if (threadIdx.x % 128 == 0) cycles[blockIdx.x * 2 + wg] = t1 - t0;
  float x = 0;
  for (int i = 0; i < 128; ++i) x += acc[i];
  for (int i = 0; i < 16; ++i) x += s32[i];
  for (int i = 0; i < 32; ++i) x += s64[i];
  if (x == 12345.0f) *sink = x;
}

void WgmmaRates() {
  int sms = 0;
  CUDA_OK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  constexpr int kSmem = 160 * 1024;
  void (*kernels[3])(int, long long*, float*) = {WgmmaRateKernel<0>, WgmmaRateKernel<1>,
                                                  WgmmaRateKernel<2>};
  for (auto k : kernels) {
    CUDA_OK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  }
  long long* cycles;
  float* sink;
  CUDA_OK(cudaMalloc(&cycles, sms * 2 * sizeof(long long)));
  CUDA_OK(cudaMalloc(&sink, 4));
  std::printf("\n### wgmma chains, one block per SM (%d SMs), cycles per instruction\n", sms);
  std::printf("| shape | warpgroups | cycles per wgmma (per group) | FLOP per cycle per SM | "
              "shared bytes per cycle per SM |\n| --- | ---: | ---: | ---: | ---: |\n");
  constexpr int kIters = 200;
  const char* names[3] = {"m64n32k16 SS", "m64n64k16 SS", "m64n256k16 SS (B MN-major)"};
  const int per_iter[3] = {36, 36, 4};
  const double flop[3] = {2.0 * 64 * 32 * 16, 2.0 * 64 * 64 * 16, 2.0 * 64 * 256 * 16};
  const double bytes[3] = {2048 + 1024, 2048 + 2048, 2048 + 8192};
  for (int mode = 0; mode < 3; ++mode) {
    for (int groups = 1; groups <= 2; ++groups) {
      kernels[mode]<<<sms, 128 * groups, kSmem>>>(kIters, cycles, sink);
      CUDA_OK(cudaGetLastError());
      CUDA_OK(cudaDeviceSynchronize());
      std::vector<long long> h(sms * 2);
      CUDA_OK(cudaMemcpy(h.data(), cycles, h.size() * 8, cudaMemcpyDeviceToHost));
      double sum = 0;
      for (int i = 0; i < sms; ++i) sum += h[i * 2];
      const double per = sum / sms / kIters / per_iter[mode];
      std::printf("| %s | %d | %.1f | %.0f | %.0f |\n", names[mode], groups, per,
                  groups * flop[mode] / per, groups * bytes[mode] / per);
    }
  }
  cudaFree(cycles);
  cudaFree(sink);
}

}  // namespace

int main(int argc, char** argv) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::printf("no CUDA device present\n");
    return 0;
  }
  WgmmaRates();
  std::vector<std::string> rows;
  for (int i = 1; i < argc; ++i) rows.emplace_back(argv[i]);
  if (rows.empty()) rows = {"128:64:4096", "128:16:8192", "64:16:8192", "64:64:8192"};
  for (const auto& r : rows) {
    int h = 0, b = 0, l = 0;
    if (std::sscanf(r.c_str(), "%d:%d:%d", &h, &b, &l) != 3) {
      std::fprintf(stderr, "bad row %s (heads:batch:len)\n", r.c_str());
      return 2;
    }
    RunRow(h, b, l);
  }
  return 0;
}
