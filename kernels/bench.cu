// kvpool-kernels-bench: times the kernels of kernels/ next to the ceilings they are judged
// against, all measured in the same run: a plain pinned 1 GiB cudaMemcpy each way (and both at
// once) for block copies, and a read-only bandwidth kernel for attention.
//
//   kvpool-kernels-bench [--csv FILE] [--quick]
//
// Every time is the median of many runs timed with CUDA events after warm-up; bandwidths count
// only the bytes a kernel must move (real sequence lengths), and every working set is many
// times the 50 MB L2. Prints markdown tables; --csv also writes the attention rows (bf16) for
// bench_sdpa.py, which times PyTorch SDPA on a padded contiguous copy of each.

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/block_copy.cuh"
#include "kernels/gqa_decode.cuh"
#include "kernels/mla_decode.cuh"
#include "kernels/reference.h"
#include "kernels/testing/cuda_ok.h"

namespace kvpool::kernels {
namespace {

struct Options {
  std::string csv;
  bool quick = false;
  std::string only;  // "gqa:QO:KV:BATCH:HI" or "mla:HEADS:KV:BATCH:HI": just that row (ncu)
  std::string rows;  // "matrix,spans": only the rows whose "group, note" holds one of these
  int reps = 0;      // overrides the number of timed runs
};

int Reps(const Options& opt, int normal, int quick) {
  return opt.reps > 0 ? opt.reps : (opt.quick ? quick : normal);
}

// Median milliseconds of `reps` runs of fn on `stream` after `warmup` runs.
double MedianMs(const std::function<void()>& fn, cudaStream_t stream, int warmup, int reps) {
  cudaEvent_t a, b;
  CUDA_OK(cudaEventCreate(&a));
  CUDA_OK(cudaEventCreate(&b));
  for (int i = 0; i < warmup; ++i) fn();
  CUDA_OK(cudaStreamSynchronize(stream));
  std::vector<float> ms(reps);
  for (int i = 0; i < reps; ++i) {
    CUDA_OK(cudaEventRecord(a, stream));
    fn();
    CUDA_OK(cudaEventRecord(b, stream));
    CUDA_OK(cudaEventSynchronize(b));
    CUDA_OK(cudaEventElapsedTime(&ms[i], a, b));
  }
  CUDA_OK(cudaEventDestroy(a));
  CUDA_OK(cudaEventDestroy(b));
  std::sort(ms.begin(), ms.end());
  return ms[reps / 2];
}

// Deterministic pseudo-random fill: bf16/fp16 values in [-1, 1) or e4m3 bytes below 2.
__global__ void FillKernel(uint32_t* p, size_t words, uint64_t seed, int kind) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < words;
       i += size_t{gridDim.x} * blockDim.x) {
    uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull ^ seed;
    x ^= x >> 31;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 29;
    uint32_t out;
    if (kind == 2) {
      out = static_cast<uint32_t>(x) & 0xBFBFBFBFu;  // e4m3, exponent < 8: |v| < 2, no NaN
    } else {
      const float f0 = (static_cast<uint32_t>(x) >> 8) * (2.0f / 16777216.0f) - 1.0f;
      const float f1 = (static_cast<uint32_t>(x >> 32) >> 8) * (2.0f / 16777216.0f) - 1.0f;
      if (kind == 0) {
        out = (__float_as_uint(f0) >> 16) | (__float_as_uint(f1) & 0xffff0000u);
      } else {
        const __half2 h = __floats2half2_rn(f0, f1);
        out = *reinterpret_cast<const uint32_t*>(&h);
      }
    }
    p[i] = out;
  }
}

void Fill(void* p, size_t bytes, uint64_t seed, int kind) {
  FillKernel<<<1024, 256>>>(static_cast<uint32_t*>(p), bytes / 4, seed, kind);
  CUDA_OK(cudaGetLastError());
  CUDA_OK(cudaDeviceSynchronize());
}

// Read-only bandwidth: every thread streams 16-byte loads, kUnroll in flight.
template <int kUnroll>
__global__ void ReadKernel(const uint4* __restrict__ p, size_t n, uint32_t* sink) {
  uint32_t acc = 0;
  const size_t stride = size_t{gridDim.x} * blockDim.x;
  size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x;
  for (; i + (kUnroll - 1) * stride < n; i += kUnroll * stride) {
    uint4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = __ldcs(p + i + u * stride);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  for (; i < n; i += stride) {
    const uint4 v = __ldcs(p + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9E3779B9u) *sink = acc;  // keeps the loads alive
}

int NumSms() {
  int dev = 0, sms = 0;
  CUDA_OK(cudaGetDevice(&dev));
  CUDA_OK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  return sms;
}

// ---------------------------------------------------------------------------------------------

struct Ceiling {
  double read_tbs = 0;  // best read-only kernel
  double d2d_tbs = 0;   // cudaMemcpy device to device, read + write bytes
};

Ceiling MeasureReadCeiling(cudaStream_t s, const Options& opt) {
  const size_t bytes = size_t{4} << 30;
  void* buf;
  uint32_t* sink;
  CUDA_OK(cudaMalloc(&buf, bytes));
  CUDA_OK(cudaMalloc(&sink, 4));
  Fill(buf, bytes, 1, 0);
  const int sms = NumSms();
  Ceiling c;
  std::printf("\n### Read-only bandwidth ceiling (4 GiB buffer)\n\n");
  std::printf("| variant | median ms | TB/s |\n| --- | ---: | ---: |\n");
  struct V {
    const char* name;
    int blocks_per_sm;
    int unroll;
  };
  const V variants[] = {{"4 blocks/SM x 256, unroll 4", 4, 4},
                        {"8 blocks/SM x 256, unroll 4", 8, 4},
                        {"4 blocks/SM x 256, unroll 8", 4, 8}};
  const size_t n = bytes / 16;
  for (const V& v : variants) {
    auto run = [&] {
      if (v.unroll == 4) {
        ReadKernel<4><<<sms * v.blocks_per_sm, 256, 0, s>>>(static_cast<uint4*>(buf), n, sink);
      } else {
        ReadKernel<8><<<sms * v.blocks_per_sm, 256, 0, s>>>(static_cast<uint4*>(buf), n, sink);
      }
    };
    const double ms = MedianMs(run, s, 3, Reps(opt, 30, 5));
    CUDA_OK(cudaGetLastError());
    const double tbs = bytes / (ms * 1e-3) / 1e12;
    c.read_tbs = std::max(c.read_tbs, tbs);
    std::printf("| %s | %.3f | %.2f |\n", v.name, ms, tbs);
  }
  // The same kernel over smaller reads, each run a fresh region (not in L2): what one launch of
  // that many bytes reaches, the floor for rows whose whole work is that small (one sequence of
  // 64k-128k tokens reads 67-75 MB).
  std::printf("\n| read of | median us | TB/s | x ceiling |\n| ---: | ---: | ---: | ---: |\n");
  for (size_t mib : {32, 64, 128, 256, 1024}) {
    const size_t size = mib << 20;
    size_t k = 0;
    auto run = [&] {
      const size_t offset = (k++ * size) % (bytes - size);
      ReadKernel<4><<<sms * 4, 256, 0, s>>>(static_cast<uint4*>(buf) + offset / 16, size / 16,
                                            sink);
    };
    const double ms = MedianMs(run, s, 3, Reps(opt, 30, 5));
    CUDA_OK(cudaGetLastError());
    const double tbs = size / (ms * 1e-3) / 1e12;
    std::printf("| %zu MiB | %.1f | %.2f | %.2fx |\n", mib, ms * 1e3, tbs, tbs / c.read_tbs);
  }
  void* dst;
  CUDA_OK(cudaMalloc(&dst, bytes / 2));
  const double ms =
      MedianMs([&] { CUDA_OK(cudaMemcpyAsync(dst, buf, bytes / 2, cudaMemcpyDeviceToDevice, s)); },
               s, 3, opt.quick ? 5 : 20);
  c.d2d_tbs = bytes / (ms * 1e-3) / 1e12;  // 2 GiB read + 2 GiB written
  std::printf("| cudaMemcpy D2D 2 GiB (read + write bytes) | %.3f | %.2f |\n", ms, c.d2d_tbs);
  std::printf("\nRead-only ceiling used below: **%.2f TB/s**\n", c.read_tbs);
  CUDA_OK(cudaFree(dst));
  CUDA_OK(cudaFree(buf));
  CUDA_OK(cudaFree(sink));
  return c;
}

// ---------------------------------------------------------------------------------------------
// Block copies

struct CopySetup {
  std::vector<KvSegment> segments;
  std::vector<int32_t> ids_a, ids_b;     // two disjoint block sets
  std::vector<uint8_t*> objs_a, objs_b;  // their host objects
  uint64_t bytes_per_op = 0;
};

// num_segments segments of seg_block_bytes blocks, each segment holding phys_blocks blocks in
// `cache`; moves `count` blocks per operation into host objects packed in pool_a / pool_b.
CopySetup MakeCopySetup(uint8_t* cache, int num_segments, uint64_t seg_block_bytes, int phys_blocks,
                        int count, uint8_t* pool_a, uint8_t* pool_b, std::mt19937_64& rng) {
  CopySetup c;
  uint64_t off = 0;
  for (int s = 0; s < num_segments; ++s) {
    c.segments.push_back(
        {reinterpret_cast<uint64_t>(cache) + uint64_t{1} * s * phys_blocks * seg_block_bytes,
         seg_block_bytes, seg_block_bytes, off});
    off += seg_block_bytes;
  }
  std::vector<int32_t> ids(phys_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  c.ids_a.assign(ids.begin(), ids.begin() + count);
  c.ids_b.assign(ids.begin() + count, ids.begin() + 2 * count);
  std::vector<int> slots(count);
  std::iota(slots.begin(), slots.end(), 0);
  std::shuffle(slots.begin(), slots.end(), rng);
  for (int i = 0; i < count; ++i) {
    c.objs_a.push_back(pool_a + uint64_t{1} * slots[i] * off);
    c.objs_b.push_back(pool_b + uint64_t{1} * slots[i] * off);
  }
  c.bytes_per_op = uint64_t{1} * count * off;
  return c;
}

const char* MethodName(CopyMethod m) {
  switch (m) {
    case CopyMethod::kKernel:
      return "kernel (zero-copy)";
    case CopyMethod::kCopyEngine:
      return "copy engine, one copy per segment block";
    case CopyMethod::kStaged:
      return "staged (pack in HBM + one copy per block object)";
    case CopyMethod::kAuto:
      return "auto";
  }
  return "?";
}

struct CopyRates {
  double d2h = 0, h2d = 0, both = 0;  // GB/s
};

// Host time (us, median) the caller's thread spends in fn, the stream idle before each call:
// what queueing a copy costs the CPU, apart from the copy itself.
double QueueUs(const std::function<void()>& fn, cudaStream_t stream, int reps) {
  std::vector<double> us;
  for (int i = 0; i <= reps; ++i) {
    CUDA_OK(cudaStreamSynchronize(stream));
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    const auto t1 = std::chrono::steady_clock::now();
    if (i > 0) us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  CUDA_OK(cudaStreamSynchronize(stream));
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

// Staging buffers for kStaged: one per stream.
CopyStaging g_staging[2];

CopyRates TimeCopies(const CopySetup& c, CopyMethod m, cudaStream_t s1, cudaStream_t s2, int reps) {
  CopyRates r;
  const int ns = static_cast<int>(c.segments.size());
  const int nb = static_cast<int>(c.ids_a.size());
  auto gather = [&](cudaStream_t s) {
    CUDA_OK(CopyBlocks(c.segments.data(), ns, c.ids_a.data(), c.objs_a.data(), nb,
                       CopyDirection::kDeviceToHost, m, g_staging[0], s));
  };
  auto scatter = [&](cudaStream_t s) {
    CUDA_OK(CopyBlocks(c.segments.data(), ns, c.ids_b.data(), c.objs_b.data(), nb,
                       CopyDirection::kHostToDevice, m, g_staging[s == s1 ? 0 : 1], s));
  };
  r.d2h = c.bytes_per_op / (MedianMs([&] { gather(s1); }, s1, 2, reps) * 1e-3) / 1e9;
  r.h2d = c.bytes_per_op / (MedianMs([&] { scatter(s1); }, s1, 2, reps) * 1e-3) / 1e9;
  cudaEvent_t fork, join;
  CUDA_OK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
  CUDA_OK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
  auto both = [&] {
    CUDA_OK(cudaEventRecord(fork, s1));
    CUDA_OK(cudaStreamWaitEvent(s2, fork));
    gather(s1);
    scatter(s2);
    CUDA_OK(cudaEventRecord(join, s2));
    CUDA_OK(cudaStreamWaitEvent(s1, join));
  };
  r.both = 2.0 * c.bytes_per_op / (MedianMs(both, s1, 2, reps) * 1e-3) / 1e9;
  CUDA_OK(cudaEventDestroy(fork));
  CUDA_OK(cudaEventDestroy(join));
  return r;
}

void BenchCopies(const Options& opt) {
  cudaStream_t s1, s2;
  CUDA_OK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
  CUDA_OK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
  const size_t gib = size_t{1} << 30;
  uint8_t *h1, *h2, *d1, *d2;
  CUDA_OK(cudaHostAlloc(reinterpret_cast<void**>(&h1), gib, 0));
  CUDA_OK(cudaHostAlloc(reinterpret_cast<void**>(&h2), gib, 0));
  CUDA_OK(cudaMalloc(&d1, gib));
  CUDA_OK(cudaMalloc(&d2, gib));
  std::memset(h1, 1, gib);
  std::memset(h2, 2, gib);
  Fill(d1, gib, 3, 0);
  Fill(d2, gib, 4, 0);
  const int reps = Reps(opt, 10, 5);
  const size_t staging_bytes = size_t{256} << 20;
  for (CopyStaging& st : g_staging) {
    CUDA_OK(cudaMalloc(&st.device, staging_bytes));
    st.bytes = staging_bytes;
  }

  // Baseline: plain pinned 1 GiB copies.
  const double base_h2d =
      gib /
      (MedianMs([&] { CUDA_OK(cudaMemcpyAsync(d1, h1, gib, cudaMemcpyHostToDevice, s1)); }, s1, 2,
                reps) *
       1e-3) /
      1e9;
  const double base_d2h =
      gib /
      (MedianMs([&] { CUDA_OK(cudaMemcpyAsync(h1, d1, gib, cudaMemcpyDeviceToHost, s1)); }, s1, 2,
                reps) *
       1e-3) /
      1e9;
  cudaEvent_t fork, join;
  CUDA_OK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
  CUDA_OK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
  const double base_both = 2.0 * gib /
                           (MedianMs(
                                [&] {
                                  CUDA_OK(cudaEventRecord(fork, s1));
                                  CUDA_OK(cudaStreamWaitEvent(s2, fork));
                                  CUDA_OK(cudaMemcpyAsync(h1, d1, gib, cudaMemcpyDeviceToHost, s1));
                                  CUDA_OK(cudaMemcpyAsync(d2, h2, gib, cudaMemcpyHostToDevice, s2));
                                  CUDA_OK(cudaEventRecord(join, s2));
                                  CUDA_OK(cudaStreamWaitEvent(s1, join));
                                },
                                s1, 2, reps) *
                            1e-3) /
                           1e9;
  std::printf("\n### Host <-> device baseline: plain pinned 1 GiB cudaMemcpyAsync\n\n");
  std::printf("| direction | GB/s |\n| --- | ---: |\n");
  std::printf(
      "| host -> device | %.1f |\n| device -> host | %.1f |\n| both at once (sum) | %.1f |\n",
      base_h2d, base_d2h, base_both);

  // The target case: 16-token blocks of a 32-layer GQA-8 cache (d128, bf16), FlashAttention
  // layout: 64 segments of 32 KiB per block; 512 blocks (1 GiB) per operation.
  std::mt19937_64 rng(5);
  {
    const uint64_t seg_bytes = 16 * 8 * 128 * 2;
    const int phys = 1024, count = 512;  // 2 GiB of cache: d1 and d2 side by side? use one
    uint8_t* cache;
    CUDA_OK(cudaMalloc(&cache, 64 * phys * seg_bytes));
    Fill(cache, 64 * phys * seg_bytes, 6, 0);
    const CopySetup c = MakeCopySetup(cache, 64, seg_bytes, phys, count, h1, h2, rng);
    std::printf(
        "\n### Block gather/scatter: 32-layer GQA-8 cache (d128, bf16, 16-token blocks), "
        "64 segments x 32 KiB per block, 512 random blocks (1 GiB) per operation\n\n");
    std::printf(
        "| method | device -> host GB/s | vs pinned copy | host -> device GB/s | vs pinned "
        "copy | both at once GB/s | vs one direction |\n");
    std::printf("| --- | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    for (CopyMethod m :
         {CopyMethod::kKernel, CopyMethod::kCopyEngine, CopyMethod::kStaged, CopyMethod::kAuto}) {
      const CopyRates r = TimeCopies(c, m, s1, s2, reps);
      std::printf("| %s | %.1f | %.2fx | %.1f | %.2fx | %.1f | %.2fx |\n", MethodName(m), r.d2h,
                  r.d2h / base_d2h, r.h2d, r.h2d / base_h2d, r.both,
                  r.both / std::max(r.d2h, r.h2d));
    }
    // What queueing costs the calling thread: whole blocks in calls of 512 and of 128 (the
    // engine plugin's batches), and one layer of 512 blocks (2 segments: a layer-wise load).
    // Host objects in pinned memory (h2) and, as a same-host pool is, in shared memory
    // registered with cudaHostRegister; staging of 64 MiB, as the engine plugin has.
    void* shm = mmap(nullptr, gib, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (shm == MAP_FAILED) std::abort();
    std::memset(shm, 7, gib);
    CUDA_OK(cudaHostRegister(shm, gib, cudaHostRegisterDefault));
    uint8_t* reg = static_cast<uint8_t*>(shm);
    const CopySetup whole_reg = MakeCopySetup(cache, 64, seg_bytes, phys, count, h1, reg, rng);
    const CopySetup layer = MakeCopySetup(cache, 2, seg_bytes, phys, count, h1, reg, rng);
    CopyStaging staging64 = g_staging[0];
    staging64.bytes = size_t{64} << 20;
    std::printf(
        "\n### Host time to queue one call (us, median; host -> device, 64 MiB staging, the "
        "stream idle before each)\n\n| method | 512 blocks x 64 segments, pinned | the same, "
        "registered shared memory | 128 blocks x 64 segments, registered | 512 blocks x 2 "
        "segments (one layer), registered |\n| --- | ---: | ---: | ---: | ---: |\n");
    for (CopyMethod m :
         {CopyMethod::kKernel, CopyMethod::kCopyEngine, CopyMethod::kStaged, CopyMethod::kAuto}) {
      auto queue = [&](const CopySetup& setup, int n) {
        return QueueUs(
            [&] {
              CUDA_OK(CopyBlocks(setup.segments.data(), static_cast<int>(setup.segments.size()),
                                 setup.ids_b.data(), setup.objs_b.data(), n,
                                 CopyDirection::kHostToDevice, m, staging64, s1));
            },
            s1, reps);
      };
      std::printf("| %s | %.1f | %.1f | %.1f | %.1f |\n", MethodName(m), queue(c, count),
                  queue(whole_reg, count), queue(whole_reg, 128), queue(layer, count));
    }
    CUDA_OK(cudaHostUnregister(shm));
    munmap(shm, gib);
    CUDA_OK(cudaFree(cache));
  }

  // Size sweep: per-segment block bytes, 64 segments, ~512 MiB per operation.
  std::printf(
      "\n### Block copy methods by per-segment block size (64 segments, 512 MiB per "
      "operation)\n\n");
  std::printf(
      "| segment block bytes | kernel D2H | copy engine D2H | staged D2H | kernel H2D | "
      "copy engine H2D | staged H2D | kernel both | staged both |\n");
  std::printf("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
  for (uint64_t bytes : {uint64_t{2048}, uint64_t{8192}, uint64_t{32768}, uint64_t{131072},
                         uint64_t{524288}, uint64_t{2097152}}) {
    const int count = static_cast<int>((uint64_t{512} << 20) / (64 * bytes));
    const CopySetup c = MakeCopySetup(d1, 64, bytes, 2 * count, count, h1, h2, rng);
    const CopyRates k = TimeCopies(c, CopyMethod::kKernel, s1, s2, Reps(opt, 5, 3));
    const CopyRates e = TimeCopies(c, CopyMethod::kCopyEngine, s1, s2, Reps(opt, 5, 3));
    const CopyRates st = TimeCopies(c, CopyMethod::kStaged, s1, s2, Reps(opt, 5, 3));
    std::printf("| %llu | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f |\n",
                static_cast<unsigned long long>(bytes), k.d2h, e.d2h, st.d2h, k.h2d, e.h2d, st.h2d,
                k.both, st.both);
    std::fflush(stdout);
  }
  CUDA_OK(cudaEventDestroy(fork));
  CUDA_OK(cudaEventDestroy(join));
  CUDA_OK(cudaFreeHost(h1));
  CUDA_OK(cudaFreeHost(h2));
  CUDA_OK(cudaFree(d1));
  CUDA_OK(cudaFree(d2));
  for (CopyStaging& st : g_staging) CUDA_OK(cudaFree(st.device));
  CUDA_OK(cudaStreamDestroy(s1));
  CUDA_OK(cudaStreamDestroy(s2));
}

// ---------------------------------------------------------------------------------------------
// Attention decode: the serving-shape matrix.
//
// Each row names its shape and its lengths: every sequence at `hi`, or (lo < hi) ragged lengths
// from SeededLengths(batch, lo, hi, seed), the first at hi. The kernels run the plan made from the
// real lengths; "blind plan" times the same kernels under the plan for every sequence at hi (what
// a caller without host lengths gets). Bandwidth counts the bytes of the real lengths.

enum class Layout { kKvFirst, kBlocksFirst };

struct GqaRow {
  const char* group;  // "matrix", "full context", "variant"
  int qo, kv, d, bs, batch, lo, hi;
  DType kv_type = DType::kBF16;
  Layout layout = Layout::kKvFirst;
  GqaDecodeOptions options = {};
  std::string note;
};

std::vector<int32_t> RowLengths(int batch, int lo, int hi, uint64_t seed) {
  if (lo >= hi) return std::vector<int32_t>(batch, hi);
  return SeededLengths(batch, lo, hi, seed);
}

std::string LensNote(int batch, int lo, int hi) {
  char buf[64];
  auto k = [](int v) {
    char b[16];
    if (v % 1024 == 0) {
      std::snprintf(b, sizeof(b), "%dk", v / 1024);
    } else {
      std::snprintf(b, sizeof(b), "%d", v);
    }
    return std::string(b);
  };
  if (lo >= hi) {
    std::snprintf(buf, sizeof(buf), "%d x %s", batch, k(hi).c_str());
  } else {
    std::snprintf(buf, sizeof(buf), "%d x %s-%s", batch, k(lo).c_str(), k(hi).c_str());
  }
  return buf;
}

const char* KvName(DType t) {
  return t == DType::kBF16 ? "bf16" : (t == DType::kFP16 ? "fp16" : "e4m3");
}

// The rows whose label ("group, note") holds one of the comma-separated strings of `filter`
// (all rows if it is empty).
template <typename Row>
std::vector<Row> KeptRows(const std::vector<Row>& rows, const std::string& filter) {
  if (filter.empty()) return rows;
  std::vector<Row> kept;
  for (const Row& r : rows) {
    const std::string label = std::string(r.group) + ", " + r.note;
    size_t from = 0;
    while (from <= filter.size()) {
      const size_t to = std::min(filter.find(',', from), filter.size());
      if (label.find(filter.substr(from, to - from)) != std::string::npos) {
        kept.push_back(r);
        break;
      }
      from = to + 1;
    }
  }
  return kept;
}

std::vector<GqaRow> GqaRows(const Options& opt) {
  const DType e4 = DType::kFP8E4M3;
  const Layout bf = Layout::kBlocksFirst;
  std::vector<GqaRow> rows = {
      // The issue's matrix.
      {"matrix", 8, 1, 128, 16, 128, 512, 8192},
      {"matrix", 32, 8, 128, 16, 1, 131072, 131072},
      {"matrix", 32, 8, 128, 16, 64, 128, 16384},
      {"matrix", 32, 8, 128, 16, 8, 32768, 32768},
      {"matrix", 28, 4, 128, 16, 64, 512, 8192, DType::kBF16, Layout::kKvFirst, {}, "group 7"},
      {"matrix", 7, 1, 128, 16, 128, 512, 8192, DType::kBF16, Layout::kKvFirst, {}, "group 7"},
      {"matrix", 16, 1, 128, 16, 128, 512, 8192, DType::kBF16, Layout::kKvFirst, {}, "group 16"},
      {"matrix", 48, 3, 128, 16, 64, 512, 8192, DType::kBF16, Layout::kKvFirst, {}, "group 16"},
      {"matrix", 16, 2, 128, 16, 64, 512, 8192},
      {"matrix", 32, 4, 128, 16, 64, 512, 8192},
      {"matrix", 32, 8, 64, 16, 64, 128, 16384},
      {"matrix", 16, 4, 256, 16, 32, 128, 16384},
      {"matrix", 32, 8, 128, 16, 64, 128, 16384, DType::kBF16, bf, {}, "blocks-first"},
      {"matrix", 32, 8, 128, 64, 64, 128, 16384, DType::kBF16, bf, {}, "blocks-first"},
      {"matrix", 32, 8, 128, 16, 64, 128, 16384, e4, Layout::kKvFirst, {}, "e4m3 bytes"},
      {"matrix", 8, 1, 128, 16, 1, 131072, 131072},
      // The previous table: 64/8 heads, every sequence at full context.
      {"full context", 64, 8, 128, 16, 32, 4096, 4096},
      {"full context", 64, 8, 128, 16, 128, 4096, 4096},
      {"full context", 64, 8, 128, 16, 32, 32768, 32768},
      {"full context", 64, 8, 128, 64, 64, 8192, 8192},
      {"full context", 64, 8, 128, 16, 128, 32768, 32768},
  };
  // Each row of `shapes` again with these options, and a note saying which.
  auto add_variants = [&rows](const std::vector<GqaRow>& shapes, const GqaDecodeOptions& options,
                              const std::string& note) {
    for (GqaRow v : shapes) {
      v.options = options;
      v.note = note;
      rows.push_back(v);
    }
  };
  // All 8 kv heads in each block (whole 2 KiB token rows), also on the one long sequence and
  // the rows within a few percent of 0.9x.
  GqaDecodeOptions eight;
  eight.warps = 8;
  add_variants(
      {
          {"variant", 64, 8, 128, 16, 128, 4096, 4096},
          {"variant", 32, 8, 128, 16, 64, 128, 16384},
          {"variant", 32, 8, 128, 16, 1, 131072, 131072},
          {"variant", 64, 8, 128, 16, 32, 4096, 4096},
          {"variant", 32, 8, 64, 16, 64, 128, 16384},
          {"variant", 32, 8, 128, 16, 64, 128, 16384, e4},
      },
      eight, "8 kv heads per block");
  GqaDecodeOptions four, one;
  four.warps = 4;
  one.warps = 1;
  rows.push_back({"variant", 48, 3, 128, 16, 64, 512, 8192, DType::kBF16, Layout::kKvFirst, four,
                  "4 warps per block"});
  rows.push_back({"variant", 28, 4, 128, 16, 64, 512, 8192, DType::kBF16, Layout::kKvFirst, one,
                  "1 warp per block"});
  rows.push_back({"variant", 16, 2, 128, 16, 64, 512, 8192, DType::kBF16, Layout::kKvFirst, one,
                  "1 warp per block"});
  rows.push_back({"variant", 32, 8, 128, 16, 64, 128, 16384, DType::kBF16, Layout::kKvFirst, one,
                  "1 warp per block"});
  GqaDecodeOptions rows8;
  rows8.rows8 = true;
  rows.push_back({"variant", 16, 1, 128, 16, 128, 512, 8192, DType::kBF16, Layout::kKvFirst, rows8,
                  "8 query heads per warp"});
  // 1-warp blocks with 3-stage rings (more blocks, hence warps, per SM) on the rows of few kv
  // heads.
  GqaDecodeOptions shallow;
  shallow.warps = 1;
  shallow.stages = 3;
  add_variants(
      {
          {"variant", 8, 1, 128, 16, 128, 512, 8192},
          {"variant", 7, 1, 128, 16, 128, 512, 8192},
          {"variant", 16, 1, 128, 16, 128, 512, 8192},
          {"variant", 48, 3, 128, 16, 64, 512, 8192},
          {"variant", 16, 2, 128, 16, 64, 512, 8192},
          {"variant", 28, 4, 128, 16, 64, 512, 8192},
          {"variant", 32, 4, 128, 16, 64, 512, 8192},
          {"variant", 8, 1, 128, 16, 1, 131072, 131072},
      },
      shallow, "1 warp x 3 stages");  // (no commas in notes: the CSV)
  // The merge kernel launched plainly after the attention kernel (the previous launch).
  GqaDecodeOptions plain;
  plain.plain_merge = true;
  add_variants(
      {
          {"variant", 8, 1, 128, 16, 128, 512, 8192},
          {"variant", 32, 8, 128, 16, 1, 131072, 131072},
          {"variant", 32, 8, 128, 16, 64, 128, 16384},
          {"variant", 8, 1, 128, 16, 1, 131072, 131072},
      },
      plain, "merge launched plainly");
  // Forced chunks: on the 1-kv-head row and the one long sequence, more, shorter items taken
  // from the counter; on the rows within a few percent of 0.9x, cuts around the planned one
  // (does the planner's cost model pick the fastest cut on this device?).
  for (const auto& [row, chunks] : std::vector<std::pair<GqaRow, std::vector<int>>>{
           {{"variant", 8, 1, 128, 16, 128, 512, 8192}, {256, 512}},
           {{"variant", 32, 8, 128, 16, 1, 131072, 131072}, {512, 1024}},
           {{"variant", 32, 8, 64, 16, 64, 128, 16384}, {1024, 2048, 3072}},
           {{"variant", 16, 4, 256, 16, 32, 128, 16384}, {768, 1536, 2048}},
           {{"variant", 28, 4, 128, 16, 64, 512, 8192}, {832, 1024, 2048}},
           {{"variant", 32, 4, 128, 16, 64, 512, 8192}, {1024, 2048}},
           {{"variant", 32, 8, 128, 16, 64, 128, 16384, e4}, {1024, 2048, 3280}},
           {{"variant", 64, 8, 128, 16, 32, 4096, 4096}, {1024, 4096}},
       }) {
    for (int chunk : chunks) {
      GqaRow v = row;
      v.options.chunk = chunk;
      v.note = "chunk " + std::to_string(chunk);
      rows.push_back(v);
    }
  }
  {
    GqaRow v{"variant", 48, 3, 128, 16, 64, 512, 8192};
    v.options.stages = 4;
    v.note = "1 warp x 4 stages";
    rows.push_back(v);
  }
  // Several warps per kv head, each taking every 2nd or 4th tile of an item (blocks of one kv
  // head), and equal spans per block, on the rows of one to three kv heads; against the matrix
  // rows above (the planner's default) in the same run.
  const std::vector<GqaRow> few_kv = {
      {"variant", 8, 1, 128, 16, 128, 512, 8192},  {"variant", 7, 1, 128, 16, 128, 512, 8192},
      {"variant", 16, 1, 128, 16, 128, 512, 8192}, {"variant", 48, 3, 128, 16, 64, 512, 8192},
      {"variant", 16, 2, 128, 16, 64, 512, 8192},  {"variant", 8, 1, 128, 16, 1, 131072, 131072},
  };
  for (int tw : {1, 2, 4}) {
    for (bool spans : {false, true}) {
      if (tw == 1 && !spans) continue;  // the matrix rows
      GqaDecodeOptions o;
      o.tile_warps = tw;
      o.spans = spans;
      std::string note = tw == 1 ? "" : std::to_string(tw) + " warps per kv head";
      if (spans) note += note.empty() ? "spans" : " + spans";
      add_variants(few_kv, o, note);
    }
  }
  // Equal spans per block taken whatever the model says.
  {
    GqaDecodeOptions o;
    o.force_spans = true;
    add_variants({few_kv.begin(), few_kv.end() - 1}, o, "forced spans");
  }
  // The cache's piece size: blocks of 16 tokens of one kv head are 4 KiB pieces of K and of V,
  // scattered; larger blocks make larger pieces (same lengths and plan).
  for (int bs : {32, 64, 256}) {
    for (int tw : {1, 4}) {
      GqaRow v{"variant", 8, 1, 128, bs, 128, 512, 8192};
      v.options.tile_warps = tw;
      v.note = "block " + std::to_string(bs) + (tw > 1 ? " + 4 warps per kv head" : "");
      rows.push_back(v);
    }
  }
  rows.push_back(
      {"variant", 16, 2, 128, 64, 64, 512, 8192, DType::kBF16, Layout::kKvFirst, {}, "block 64"});
  // Few long sequences of one or two kv heads: fewer units than SMs.
  for (int tw : {1, 2, 4}) {
    GqaDecodeOptions o;
    o.tile_warps = tw;
    add_variants(
        {
            {"variant", 8, 1, 128, 16, 4, 32768, 32768},
            {"variant", 8, 1, 128, 16, 16, 8192, 8192},
            {"variant", 16, 2, 128, 16, 2, 65536, 65536},
            {"variant", 16, 1, 128, 16, 1, 131072, 131072},
        },
        o, tw == 1 ? "long" : "long + " + std::to_string(tw) + " warps per kv head");
  }
  // The planner's previous choice where it changed: one warp per kv head (3-stage rings) on the
  // group-16 rows.
  {
    GqaDecodeOptions o;
    o.tile_warps = 1;
    add_variants(
        {
            {"variant", 16, 1, 128, 16, 128, 512, 8192},
            {"variant", 48, 3, 128, 16, 64, 512, 8192},
        },
        o, "1 warp per kv head");
  }
  rows = KeptRows(rows, opt.rows);
  if (opt.quick) rows.resize(std::min<size_t>(rows.size(), 6));
  return rows;
}

void BenchGqa(const Options& opt, const Ceiling& ceil, FILE* csv) {
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const std::vector<GqaRow> rows = GqaRows(opt);
  const int64_t pool_bytes = int64_t{18} << 30;  // 128 x 32k tokens of 8 x 128 bf16 K and V
  void* pool;
  CUDA_OK(cudaMalloc(&pool, pool_bytes));
  int filled = -1;  // FillKernel kind the pool holds
  std::mt19937_64 rng(8);

  std::printf(
      "\n### GQA decode: serving-shape matrix (paged; lengths: batch x hi, or ragged "
      "lo-hi from SeededLengths(seed 1))\n\n");
  std::printf(
      "| rows | heads q/kv | d | kv | layout | block | lengths | median us | TB/s | vs read "
      "ceiling | blind plan us | plan |\n| --- | ---: | ---: | --- | --- | ---: | --- | ---: | "
      "---: | ---: | ---: | --- |\n");
  for (const GqaRow& r : rows) {
    if (!opt.only.empty()) {
      char want[64];
      std::snprintf(want, sizeof(want), "gqa:%d:%d:%d:%d", r.qo, r.kv, r.batch, r.hi);
      if (opt.only != want) continue;
    }
    const int eb = DTypeBytes(r.kv_type);
    const int64_t block_elems = int64_t{2} * r.bs * r.kv * r.d;  // K and V of one block
    const int64_t num_blocks = pool_bytes / eb / block_elems;
    const PagedKvLayout layout = r.layout == Layout::kKvFirst
                                     ? PagedKvLayout::KvFirst(num_blocks, r.bs, r.kv, r.d)
                                     : PagedKvLayout::BlocksFirst(r.bs, r.kv, r.d);
    const std::vector<int32_t> lens = RowLengths(r.batch, r.lo, r.hi, 1);
    const int bps = (r.hi + r.bs - 1) / r.bs;
    const int64_t needed = int64_t{r.batch} * bps;
    if (needed > num_blocks) {
      std::printf("| %s | %d/%d | (skipped: pool too small) |\n", r.group, r.qo, r.kv);
      continue;
    }
    const int kind = r.kv_type == DType::kBF16 ? 0 : (r.kv_type == DType::kFP16 ? 1 : 2);
    if (kind != filled) {
      Fill(pool, pool_bytes, 9 + kind, kind);
      filled = kind;
    }
    std::vector<int32_t> ids(num_blocks);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    ids.resize(needed);
    int32_t *d_table, *d_lens;
    void *q, *o, *ws, *ws_blind;
    float* lse;
    const DType q_type = r.kv_type == DType::kFP16 ? DType::kFP16 : DType::kBF16;
    CUDA_OK(cudaMalloc(&d_table, needed * 4));
    CUDA_OK(cudaMalloc(&d_lens, r.batch * 4));
    CUDA_OK(cudaMalloc(&q, size_t{2} * r.batch * r.qo * r.d));
    CUDA_OK(cudaMalloc(&o, size_t{2} * r.batch * r.qo * r.d));
    CUDA_OK(cudaMalloc(&lse, size_t{4} * r.batch * r.qo));
    const GqaDecodeShape shape{r.batch, r.qo, r.kv, r.d, r.bs, bps};
    const size_t ws_bytes = GqaDecodeWorkspaceBytes(shape, q_type, r.kv_type, r.hi, r.options);
    if (ws_bytes == 0) {
      std::printf("| %s | %d/%d | refused: %s |\n", r.group, r.qo, r.kv,
                  GqaDecodeSupported(shape, q_type, r.kv_type).reason.c_str());
      continue;
    }
    CUDA_OK(cudaMalloc(&ws, ws_bytes));
    CUDA_OK(cudaMalloc(&ws_blind, ws_bytes));
    CUDA_OK(cudaMemcpy(d_table, ids.data(), needed * 4, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(d_lens, lens.data(), r.batch * 4, cudaMemcpyHostToDevice));
    Fill(q, size_t{2} * r.batch * r.qo * r.d, 10, q_type == DType::kFP16 ? 1 : 0);
    const AttentionScales scales{1.0f / std::sqrt(static_cast<float>(r.d)), 1.0f, 1.0f};
    GqaDecodePlan plan, blind;
    KernelStatus st = PlanGqaDecode(shape, q_type, r.kv_type, lens.data(), r.hi, ws, ws_bytes, s,
                                    &plan, r.options);
    GqaDecodeOptions blind_options = r.options;
    blind_options.uniform = true;
    if (st.ok()) {
      st = PlanGqaDecode(shape, q_type, r.kv_type, lens.data(), r.hi, ws_blind, ws_bytes, s, &blind,
                         blind_options);
    }
    if (!st.ok()) {
      std::printf("| %s | %d/%d | plan refused: %s |\n", r.group, r.qo, r.kv, st.reason.c_str());
      continue;
    }
    auto run = [&](const GqaDecodePlan& pl) {
      const KernelStatus rs = RunGqaDecode(pl, q, pool, layout, d_table, d_lens, scales, o, lse, s);
      if (!rs.ok()) {
        std::fprintf(stderr, "RunGqaDecode: %s\n", rs.reason.c_str());
        std::exit(1);
      }
    };
    const double ms = MedianMs([&] { run(plan); }, s, 3, Reps(opt, 30, 10));
    const double blind_ms = MedianMs([&] { run(blind); }, s, 3, Reps(opt, 20, 5));
    double tokens = 0;
    for (int32_t l : lens) tokens += l;
    const double bytes = tokens * r.kv * r.d * 2 * eb +                          // K and V
                         2.0 * r.batch * r.qo * r.d * 2 + 4.0 * r.batch * r.qo;  // q, o, lse
    const double tbs = bytes / (ms * 1e-3) / 1e12;
    const std::string lens_note = LensNote(r.batch, r.lo, r.hi);
    std::printf("| %s%s%s | %d/%d | %d | %s | %s | %d | %s | %.1f | %.2f | %.2fx | %.1f | %s |\n",
                r.group, r.note.empty() ? "" : ", ", r.note.c_str(), r.qo, r.kv, r.d,
                KvName(r.kv_type), r.layout == Layout::kKvFirst ? "K/V-first" : "blocks-first",
                r.bs, lens_note.c_str(), ms * 1e3, tbs, tbs / ceil.read_tbs, blind_ms * 1e3,
                DescribePlan(plan.split).c_str());
    std::fflush(stdout);
    if (csv != nullptr && r.kv_type == DType::kBF16) {
      std::fprintf(csv, "gqa,%s%s%s,%d,%d,%d,%d,%d,%d,%d,%.6f,%.0f,%.4f\n", r.group,
                   r.note.empty() ? "" : " ", r.note.c_str(), r.qo, r.kv, r.d, r.bs, r.batch, r.lo,
                   r.hi, ms, bytes, ceil.read_tbs);
    }
    CUDA_OK(cudaFree(d_table));
    CUDA_OK(cudaFree(d_lens));
    CUDA_OK(cudaFree(q));
    CUDA_OK(cudaFree(o));
    CUDA_OK(cudaFree(lse));
    CUDA_OK(cudaFree(ws));
    CUDA_OK(cudaFree(ws_blind));
  }
  CUDA_OK(cudaFree(pool));
  CUDA_OK(cudaStreamDestroy(s));
}

struct MlaRow {
  const char* group;
  int heads, batch, lo, hi;
  DType kv_type = DType::kBF16;
  MlaDecodeOptions options = {};
  const char* note = "";
};

void BenchMla(const Options& opt, const Ceiling& ceil, FILE* csv) {
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const DType e4 = DType::kFP8E4M3;
  MlaDecodeOptions by16, by64, rows_copy, plain;
  by16.heads_per_block = 16;
  by64.heads_per_block = 64;
  rows_copy.row_copies = true;
  plain.plain_merge = true;
  MlaDecodeOptions chunk256, chunk512;  // more items than blocks: taken from the counter
  chunk256.chunk = 256;
  chunk512.chunk = 512;
  MlaDecodeOptions per_seq;  // the plan before spans
  per_seq.no_spans = true;
  MlaDecodeOptions spans;  // equal spans even where the model sees less than 10% gain
  spans.force_spans = true;
  MlaDecodeOptions eager;  // the wgmma kernel's O rescaled at every new maximum
  eager.eager_rescale = true;
  std::vector<MlaRow> rows = {
      {"matrix", 128, 16, 8192, 8192},
      {"matrix", 128, 16, 8192, 8192, e4},
      {"matrix", 64, 16, 8192, 8192},
      {"matrix", 16, 1, 65536, 65536},
      {"matrix", 16, 1, 65536, 65536, e4},
      {"matrix", 16, 64, 1024, 16384},
      {"matrix", 16, 64, 1024, 16384, e4},
      {"matrix", 32, 32, 1024, 16384},
      {"matrix", 128, 1, 32768, 32768},
      {"full context", 64, 64, 8192, 8192},
      {"full context", 128, 64, 4096, 4096},
      {"eager rescale", 128, 16, 8192, 8192, DType::kBF16, eager, "eager rescale"},
      {"eager rescale", 64, 16, 8192, 8192, DType::kBF16, eager, "eager rescale"},
      {"eager rescale", 64, 64, 8192, 8192, DType::kBF16, eager, "eager rescale"},
      {"eager rescale", 128, 64, 4096, 4096, DType::kBF16, eager, "eager rescale"},
      {"full context", 16, 128, 8192, 8192},
      {"full context", 32, 128, 8192, 8192},
      {"full context", 16, 128, 8192, 8192, e4},
      {"full context", 32, 128, 8192, 8192, e4},
      {"variant", 32, 128, 8192, 8192, DType::kBF16, by16, "16 heads per block"},
      {"variant", 128, 16, 8192, 8192, DType::kBF16, by64, "64 heads per block (wgmma)"},
      {"variant", 64, 16, 8192, 8192, DType::kBF16, by64, "64 heads per block (wgmma)"},
      {"variant", 128, 1, 32768, 32768, DType::kBF16, by64, "64 heads per block (wgmma)"},
      {"variant", 64, 64, 8192, 8192, DType::kBF16, by64, "64 heads per block (wgmma)"},
      {"variant", 128, 64, 4096, 4096, DType::kBF16, by64, "64 heads per block (wgmma)"},

      {"variant", 32, 128, 8192, 8192, DType::kBF16, rows_copy, "one bulk copy per row"},
      {"variant", 16, 1, 65536, 65536, DType::kBF16, plain, "merge launched plainly"},
      {"variant", 128, 16, 8192, 8192, DType::kBF16, plain, "merge launched plainly"},
      {"variant", 32, 32, 1024, 16384, DType::kBF16, plain, "merge launched plainly"},
      {"variant", 16, 1, 65536, 65536, DType::kBF16, chunk256, "chunk 256"},
      {"variant", 128, 1, 32768, 32768, DType::kBF16, chunk512, "chunk 512"},
      {"variant", 16, 64, 1024, 16384, DType::kBF16, per_seq, "per-sequence plan"},
      {"variant", 16, 64, 1024, 16384, e4, per_seq, "per-sequence plan"},
      {"variant", 32, 32, 1024, 16384, DType::kBF16, spans, "spans forced"},
      {"variant", 16, 64, 1024, 16384, DType::kBF16, spans, "spans forced"},
  };
  rows = KeptRows(rows, opt.rows);
  if (opt.quick) rows.resize(std::min<size_t>(rows.size(), 6));
  const int bs = 64;
  const int64_t max_tokens = int64_t{128} * 8192;
  const int64_t num_blocks = max_tokens / bs * 2;  // room to shuffle
  const size_t pool_bytes = size_t{1} * num_blocks * bs * kMlaKDim * 2;
  void* pool;
  CUDA_OK(cudaMalloc(&pool, pool_bytes));
  int filled = -1;
  std::mt19937_64 rng(9);
  std::printf(
      "\n### MLA decode: serving-shape matrix (block %d, latent 512 + rope 64; ragged "
      "lengths from SeededLengths(seed 1))\n\n",
      bs);
  std::printf(
      "| rows | heads | kv | lengths | median us | TB/s | vs read ceiling | TFLOP/s | blind plan "
      "us | plan |\n| --- | ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | --- |\n");
  for (const MlaRow& row : rows) {
    if (!opt.only.empty()) {
      char want[64];
      std::snprintf(want, sizeof(want), "mla:%d:%s:%d:%d", row.heads, KvName(row.kv_type),
                    row.batch, row.hi);
      if (opt.only != want) continue;
    }
    const int kind = row.kv_type == DType::kBF16 ? 0 : 2;
    if (kind != filled) {
      Fill(pool, pool_bytes, 11, kind);
      filled = kind;
    }
    const int eb = DTypeBytes(row.kv_type);
    const std::vector<int32_t> lens = RowLengths(row.batch, row.lo, row.hi, 1);
    const int bps = (row.hi + bs - 1) / bs;
    std::vector<int32_t> ids(num_blocks * 2 / eb);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    ids.resize(int64_t{row.batch} * bps);
    int32_t *d_table, *d_lens;
    void *q, *o, *ws, *ws_blind;
    float* lse;
    CUDA_OK(cudaMalloc(&d_table, ids.size() * 4));
    CUDA_OK(cudaMalloc(&d_lens, row.batch * 4));
    CUDA_OK(cudaMalloc(&q, size_t{2} * row.batch * row.heads * kMlaKDim));
    CUDA_OK(cudaMalloc(&o, size_t{2} * row.batch * row.heads * kMlaVDim));
    CUDA_OK(cudaMalloc(&lse, size_t{4} * row.batch * row.heads));
    const MlaDecodeShape shape{row.batch, row.heads, bs, bps, int64_t{bs} * kMlaKDim};
    const size_t ws_bytes =
        MlaDecodeWorkspaceBytes(shape, DType::kBF16, row.kv_type, row.hi, row.options);
    if (ws_bytes == 0) {
      std::printf("| %s | %d | refused: %s |\n", row.group, row.heads,
                  MlaDecodeSupported(shape, DType::kBF16, row.kv_type).reason.c_str());
      continue;
    }
    CUDA_OK(cudaMalloc(&ws, ws_bytes));
    CUDA_OK(cudaMalloc(&ws_blind, ws_bytes));
    CUDA_OK(cudaMemcpy(d_table, ids.data(), ids.size() * 4, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(d_lens, lens.data(), row.batch * 4, cudaMemcpyHostToDevice));
    Fill(q, size_t{2} * row.batch * row.heads * kMlaKDim, 12, 0);
    const AttentionScales scales{1.0f / std::sqrt(192.0f), 1.0f, 1.0f};
    MlaDecodePlan plan, blind;
    KernelStatus st = PlanMlaDecode(shape, DType::kBF16, row.kv_type, lens.data(), row.hi, ws,
                                    ws_bytes, s, &plan, row.options);
    MlaDecodeOptions blind_options = row.options;
    blind_options.uniform = true;
    if (st.ok()) {
      st = PlanMlaDecode(shape, DType::kBF16, row.kv_type, lens.data(), row.hi, ws_blind, ws_bytes,
                         s, &blind, blind_options);
    }
    if (!st.ok()) {
      std::printf("| %s | %d | plan refused: %s |\n", row.group, row.heads, st.reason.c_str());
      continue;
    }
    auto run = [&](const MlaDecodePlan& pl) {
      const KernelStatus rs = RunMlaDecode(pl, q, pool, d_table, d_lens, scales, o, lse, s);
      if (!rs.ok()) {
        std::fprintf(stderr, "RunMlaDecode: %s\n", rs.reason.c_str());
        std::exit(1);
      }
    };
    const double ms = MedianMs([&] { run(plan); }, s, 3, Reps(opt, 30, 10));
    const double blind_ms = MedianMs([&] { run(blind); }, s, 3, Reps(opt, 20, 5));
    double tokens = 0;
    for (int32_t l : lens) tokens += l;
    const double bytes = tokens * kMlaKDim * eb +
                         2.0 * row.batch * row.heads * (kMlaKDim + kMlaVDim) +
                         4.0 * row.batch * row.heads;
    const double tbs = bytes / (ms * 1e-3) / 1e12;
    // The MMAs' useful work: scores over the 576-wide key, outputs over the 512 value dims.
    const double flops = 2.0 * tokens * row.heads * (kMlaKDim + kMlaVDim);
    const double tflops = flops / (ms * 1e-3) / 1e12;
    const std::string lens_note = LensNote(row.batch, row.lo, row.hi);
    std::printf("| %s%s%s | %d | %s | %s | %.1f | %.2f | %.2fx | %.0f | %.1f | %s |\n", row.group,
                *row.note ? ", " : "", row.note, row.heads, KvName(row.kv_type), lens_note.c_str(),
                ms * 1e3, tbs, tbs / ceil.read_tbs, tflops, blind_ms * 1e3,
                (std::to_string(plan.heads_per_block) + " heads/block, " +
                 DescribePlan(plan.split))
                    .c_str());
    std::fflush(stdout);
    if (csv != nullptr && row.kv_type == DType::kBF16 && *row.note == 0) {
      std::fprintf(csv, "mla,%s,%d,1,576,%d,%d,%d,%d,%.6f,%.0f,%.4f\n", row.group, row.heads, bs,
                   row.batch, row.lo, row.hi, ms, bytes, ceil.read_tbs);
    }
    CUDA_OK(cudaFree(d_table));
    CUDA_OK(cudaFree(d_lens));
    CUDA_OK(cudaFree(q));
    CUDA_OK(cudaFree(o));
    CUDA_OK(cudaFree(lse));
    CUDA_OK(cudaFree(ws));
    CUDA_OK(cudaFree(ws_blind));
  }
  CUDA_OK(cudaFree(pool));
  CUDA_OK(cudaStreamDestroy(s));
}

}  // namespace
}  // namespace kvpool::kernels

int main(int argc, char** argv) {
  using namespace kvpool::kernels;
  Options opt;
  std::string sections = "copy,gqa,mla";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--csv" && i + 1 < argc) {
      opt.csv = argv[++i];
    } else if (a == "--quick") {
      opt.quick = true;
    } else if (a == "--sections" && i + 1 < argc) {
      sections = argv[++i];
    } else if (a == "--only" && i + 1 < argc) {
      opt.only = argv[++i];
    } else if (a == "--reps" && i + 1 < argc) {
      opt.reps = std::atoi(argv[++i]);
    } else if (a == "--rows" && i + 1 < argc) {
      opt.rows = argv[++i];
    } else {
      std::fprintf(stderr,
                   "usage: %s [--csv FILE] [--quick] [--sections copy,gqa,mla] [--only ROW] "
                   "[--reps N] [--rows LABEL,...]\n",
                   argv[0]);
      return 2;
    }
  }
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    std::printf("no CUDA device present; nothing to measure\n");
    return 0;
  }
  cudaDeviceProp prop;
  CUDA_OK(cudaGetDeviceProperties(&prop, 0));
  int runtime = 0, driver = 0;
  CUDA_OK(cudaRuntimeGetVersion(&runtime));
  CUDA_OK(cudaDriverGetVersion(&driver));
  std::printf("## kvpool-kernels-bench on %s (%d SMs, %.0f MB L2, CUDA runtime %d, driver %d)\n",
              prop.name, prop.multiProcessorCount, prop.l2CacheSize / 1e6, runtime, driver);
  FILE* csv = opt.csv.empty() ? nullptr : std::fopen(opt.csv.c_str(), "w");
  if (!opt.csv.empty() && csv == nullptr) {
    std::fprintf(stderr, "cannot write %s\n", opt.csv.c_str());
    return 1;
  }
  if (csv != nullptr) {
    std::fprintf(csv, "kind,rows,qo,kv,d,bs,batch,lo,hi,ms,bytes,read_tbs\n");
  }
  Ceiling ceil;
  ceil.read_tbs = 4.6;  // placeholder when only one row is profiled
  if (opt.only.empty()) ceil = MeasureReadCeiling(nullptr, opt);
  if (sections.find("copy") != std::string::npos) BenchCopies(opt);
  if (sections.find("gqa") != std::string::npos) BenchGqa(opt, ceil, csv);
  if (sections.find("mla") != std::string::npos) BenchMla(opt, ceil, csv);
  if (csv != nullptr) std::fclose(csv);
  return 0;
}
