#include "kernels/testing/gpu_checks.h"

#include <cuda_runtime_api.h>
#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <sstream>
#include <thread>

#include "kernels/block_copy.cuh"
#include "kernels/dtype.h"
#include "kernels/gqa_decode.cuh"
#include "kernels/mla_decode.cuh"
#include "kernels/reference.h"

namespace kvpool::kernels::testing {
namespace {

// ---------------------------------------------------------------------------------------------
// Small RAII holders; every CUDA error becomes a failed CheckResult.

struct DeviceBuffer {
  void* ptr = nullptr;
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    if (ptr != nullptr) cudaFree(ptr);
  }
  cudaError_t Alloc(size_t bytes) { return cudaMalloc(&ptr, std::max<size_t>(bytes, 16)); }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr);
  }
};

struct PinnedBuffer {
  void* ptr = nullptr;
  PinnedBuffer() = default;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  ~PinnedBuffer() {
    if (ptr != nullptr) cudaFreeHost(ptr);
  }
  cudaError_t Alloc(size_t bytes) { return cudaHostAlloc(&ptr, std::max<size_t>(bytes, 16), 0); }
  uint8_t* bytes() const { return static_cast<uint8_t*>(ptr); }
};

// Anonymous memory registered with the driver, as a segment's shared-memory pool would be.
struct RegisteredBuffer {
  void* ptr = nullptr;
  size_t size = 0;
  bool registered = false;
  RegisteredBuffer() = default;
  RegisteredBuffer(const RegisteredBuffer&) = delete;
  RegisteredBuffer& operator=(const RegisteredBuffer&) = delete;
  ~RegisteredBuffer() {
    if (registered) cudaHostUnregister(ptr);
    if (ptr != nullptr) munmap(ptr, size);
  }
  cudaError_t Alloc(size_t bytes) {
    size = (std::max<size_t>(bytes, 16) + 4095) / 4096 * 4096;
    void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return cudaErrorMemoryAllocation;
    ptr = p;
    const cudaError_t e = cudaHostRegister(ptr, size, cudaHostRegisterDefault);
    registered = e == cudaSuccess;
    return e;
  }
  uint8_t* bytes() const { return static_cast<uint8_t*>(ptr); }
};

std::string CudaFailure(const char* what, cudaError_t e) {
  std::ostringstream s;
  s << what << ": " << cudaGetErrorName(e) << " (" << cudaGetErrorString(e) << ")";
  return s.str();
}

#define CHECK_CUDA(result, expr)                \
  do {                                          \
    const cudaError_t e_ = (expr);              \
    if (e_ != cudaSuccess) {                    \
      (result).ok = false;                      \
      (result).detail = CudaFailure(#expr, e_); \
      return result;                            \
    }                                           \
  } while (0)

void FillRandomBytes(uint8_t* p, size_t n, std::mt19937_64& rng) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const uint64_t v = rng();
    std::memcpy(p + i, &v, 8);
  }
  for (; i < n; ++i) p[i] = static_cast<uint8_t>(rng());
}

const char* DTypeName(DType t) {
  switch (t) {
    case DType::kBF16:
      return "bf16";
    case DType::kFP16:
      return "fp16";
    case DType::kFP8E4M3:
      return "e4m3";
  }
  return "?";
}

// Fills n elements of type t with NaN.
void FillNaN(void* p, size_t n, DType t) {
  if (t == DType::kFP8E4M3) {
    std::memset(p, 0x7f, n);
    return;
  }
  const uint16_t nan = t == DType::kBF16 ? 0x7fc0 : 0x7e00;
  auto* q = static_cast<uint16_t*>(p);
  std::fill(q, q + n, nan);
}

// Compares GPU outputs (type out_type) with float references.
struct Comparison {
  double rel_l2 = 0.0;
  double max_abs = 0.0;
  double lse_max_abs = 0.0;
  size_t non_finite = 0;
  size_t lse_bad = 0;
};

Comparison Compare(const void* out, DType out_type, const std::vector<float>& ref,
                   const std::vector<float>& lse_out, const std::vector<float>& lse_ref) {
  Comparison c;
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const float v = LoadAsFloat(out, static_cast<int64_t>(i), out_type);
    if (!std::isfinite(v)) {
      ++c.non_finite;
      continue;
    }
    const double diff = double{v} - ref[i];
    num += diff * diff;
    den += double{ref[i]} * ref[i];
    c.max_abs = std::max(c.max_abs, std::fabs(diff));
  }
  c.rel_l2 = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  for (size_t i = 0; i < lse_ref.size(); ++i) {
    const float a = lse_out[i], b = lse_ref[i];
    if (std::isinf(b)) {
      if (!(std::isinf(a) && a < 0)) ++c.lse_bad;
      continue;
    }
    if (!std::isfinite(a)) {
      ++c.lse_bad;
      continue;
    }
    const double d = std::fabs(double{a} - b);
    c.lse_max_abs = std::max(c.lse_max_abs, d);
    if (d > 2e-3 * (1.0 + std::fabs(b))) ++c.lse_bad;
  }
  return c;
}

std::string LensString(const std::vector<int>& lens) {
  std::ostringstream s;
  s << "lens=[";
  for (size_t i = 0; i < lens.size() && i < 8; ++i) s << (i ? "," : "") << lens[i];
  if (lens.size() > 8) s << ",... (" << lens.size() << " sequences)";
  s << "]";
  return s.str();
}

// Judges one decode's output and log-sum-exp (copied back) against the CPU reference: no
// non-finite values, and a relative L2 error within 1e-2 where bf16 is involved, else 4e-3.
// Sets res.ok and res.detail, raises `worst` to this run's error, and returns res.ok.
bool JudgeDecode(const void* o, const std::vector<float>& lse, const std::vector<float>& o_ref,
                 const std::vector<float>& lse_ref, DType q_type, DType kv_type,
                 const std::vector<int>& lens, double& worst, CheckResult& res) {
  const Comparison cmp = Compare(o, q_type, o_ref, lse, lse_ref);
  const double tol = q_type == DType::kBF16 || kv_type == DType::kBF16 ? 1e-2 : 4e-3;
  worst = std::max(worst, cmp.rel_l2);
  std::ostringstream s;
  s << LensString(lens) << " rel_l2=" << cmp.rel_l2 << " max_abs=" << cmp.max_abs
    << " lse_max_abs=" << cmp.lse_max_abs;
  if (cmp.non_finite > 0) s << " non_finite=" << cmp.non_finite;
  if (cmp.lse_bad > 0) s << " lse_bad=" << cmp.lse_bad;
  res.detail = s.str();
  res.ok = cmp.non_finite == 0 && cmp.lse_bad == 0 && cmp.rel_l2 <= tol;
  return res.ok;
}

// Random values of type t, written element-wise; fp8 values are U(-2, 2) rounded to e4m3.
void FillRandomValues(void* p, size_t n, DType t, float lo, float hi, std::mt19937_64& rng) {
  std::uniform_real_distribution<float> dist(lo, hi);
  for (size_t i = 0; i < n; ++i) StoreFromFloat(p, static_cast<int64_t>(i), t, dist(rng));
}

// Physical block ids for ragged sequences: a shuffled permutation of num_blocks ids; the ids
// left over fill the unused table entries (they point at NaN blocks).
struct BlockTable {
  int num_blocks = 0;
  int max_blocks_per_seq = 0;
  std::vector<int32_t> table;
};

BlockTable MakeBlockTable(const std::vector<int>& lens, int block_size, std::mt19937_64& rng) {
  BlockTable t;
  int needed = 0, widest = 0;
  for (int len : lens) {
    const int n = (len + block_size - 1) / block_size;
    needed += n;
    widest = std::max(widest, n);
  }
  t.num_blocks = needed + 3;
  t.max_blocks_per_seq = widest + 1;
  std::vector<int32_t> ids(t.num_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  t.table.assign(lens.size() * t.max_blocks_per_seq, 0);
  int next = 0;
  for (size_t b = 0; b < lens.size(); ++b) {
    const int n = (lens[b] + block_size - 1) / block_size;
    for (int j = 0; j < t.max_blocks_per_seq; ++j) {
      t.table[b * t.max_blocks_per_seq + j] =
          j < n ? ids[next++] : ids[needed + static_cast<int>(rng() % 3)];
    }
  }
  return t;
}

// ---------------------------------------------------------------------------------------------
// Block copies

struct CopyCase {
  std::string name;
  std::vector<KvSegment> segments;  // base = offset into the device cache
  size_t cache_bytes = 0;
  size_t object_bytes = 0;  // size of one host object
  std::vector<int32_t> block_ids;
  bool registered = false;  // host objects in cudaHostRegister'ed memory instead of pinned
  int staging_objects = 3;  // kStaged: objects per step (several steps per request)
};

CheckResult RunCopyCase(const CopyCase& c, CopyDirection dir, CopyMethod method,
                        std::mt19937_64& rng) {
  CheckResult res;
  res.name = "copy/" + c.name + (dir == CopyDirection::kDeviceToHost ? "/d2h" : "/h2d") +
             (method == CopyMethod::kKernel       ? "/kernel"
              : method == CopyMethod::kCopyEngine ? "/copy-engine"
              : method == CopyMethod::kStaged     ? "/staged"
                                                  : "/auto");
  const int n = static_cast<int>(c.block_ids.size());
  const size_t pool_bytes = c.object_bytes * n;
  DeviceBuffer cache;
  CHECK_CUDA(res, cache.Alloc(c.cache_bytes));
  PinnedBuffer pinned;
  RegisteredBuffer reg;
  uint8_t* pool = nullptr;
  if (c.registered) {
    CHECK_CUDA(res, reg.Alloc(pool_bytes));
    pool = reg.bytes();
  } else {
    CHECK_CUDA(res, pinned.Alloc(pool_bytes));
    pool = pinned.bytes();
  }
  // Host objects in shuffled order inside the pool.
  std::vector<int> slot(n);
  std::iota(slot.begin(), slot.end(), 0);
  std::shuffle(slot.begin(), slot.end(), rng);
  std::vector<uint8_t*> objects(n), expect_objects(n);
  std::vector<uint8_t> cache_mirror(c.cache_bytes), expect_pool(pool_bytes);
  for (int i = 0; i < n; ++i) {
    objects[i] = pool + size_t{1} * slot[i] * c.object_bytes;
    expect_objects[i] = expect_pool.data() + size_t{1} * slot[i] * c.object_bytes;
  }
  FillRandomBytes(cache_mirror.data(), cache_mirror.size(), rng);
  FillRandomBytes(pool, pool_bytes, rng);
  std::memcpy(expect_pool.data(), pool, pool_bytes);
  CHECK_CUDA(res,
             cudaMemcpy(cache.ptr, cache_mirror.data(), c.cache_bytes, cudaMemcpyHostToDevice));

  std::vector<KvSegment> dev_segs = c.segments, host_segs = c.segments;
  for (size_t s = 0; s < c.segments.size(); ++s) {
    dev_segs[s].base += reinterpret_cast<uint64_t>(cache.ptr);
    host_segs[s].base += reinterpret_cast<uint64_t>(cache_mirror.data());
  }
  DeviceBuffer staging_buf;
  const size_t staging_bytes = size_t{1} * c.staging_objects * ((c.object_bytes + 255) / 256 * 256);
  CHECK_CUDA(res, staging_buf.Alloc(staging_bytes));
  CHECK_CUDA(res, cudaMemset(staging_buf.ptr, 0x5a, staging_bytes));
  cudaStream_t stream;
  CHECK_CUDA(res, cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const cudaError_t e = CopyBlocks(dev_segs.data(), static_cast<int>(dev_segs.size()),
                                   c.block_ids.data(), objects.data(), n, dir, method,
                                   CopyStaging{staging_buf.ptr, staging_bytes}, stream);
  const cudaError_t e2 = cudaStreamSynchronize(stream);
  cudaStreamDestroy(stream);
  CHECK_CUDA(res, e);
  CHECK_CUDA(res, e2);
  CpuCopyBlocks(host_segs.data(), static_cast<int>(host_segs.size()), c.block_ids.data(),
                expect_objects.data(), n, dir);
  if (dir == CopyDirection::kDeviceToHost) {
    res.ok = std::memcmp(pool, expect_pool.data(), pool_bytes) == 0;
    if (!res.ok) {
      size_t first = 0;
      while (pool[first] == expect_pool[first]) ++first;
      res.detail = "host pool differs from the reference at byte " + std::to_string(first);
    }
  } else {
    std::vector<uint8_t> got(c.cache_bytes);
    CHECK_CUDA(res, cudaMemcpy(got.data(), cache.ptr, c.cache_bytes, cudaMemcpyDeviceToHost));
    res.ok = got == cache_mirror;
    if (!res.ok) {
      size_t first = 0;
      while (got[first] == cache_mirror[first]) ++first;
      res.detail = "device cache differs from the reference at byte " + std::to_string(first);
    }
  }
  if (res.ok) {
    res.detail = std::to_string(n) + " blocks x " + std::to_string(c.segments.size()) +
                 " segments, bit-exact";
  }
  return res;
}

std::vector<int32_t> DistinctIds(int count, int range, std::mt19937_64& rng) {
  std::vector<int32_t> ids(range);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  ids.resize(count);
  return ids;
}

// FlashAttention layout: per layer a (2, num_blocks, block_size, heads, d) tensor -> K and V
// segments; the host object is all segments back to back.
CopyCase FlashAttentionCase(int layers, int num_blocks, uint64_t block_bytes, int count,
                            std::mt19937_64& rng) {
  CopyCase c;
  c.name = "flash-attn/" + std::to_string(layers) + "L/" + std::to_string(block_bytes) + "B";
  uint64_t host_off = 0;
  for (int l = 0; l < layers; ++l) {
    const uint64_t layer_base = uint64_t{1} * l * 2 * num_blocks * block_bytes;
    for (int kv = 0; kv < 2; ++kv) {
      c.segments.push_back(
          {layer_base + kv * num_blocks * block_bytes, block_bytes, block_bytes, host_off});
      host_off += block_bytes;
    }
  }
  c.cache_bytes = uint64_t{1} * layers * 2 * num_blocks * block_bytes;
  c.object_bytes = host_off;
  c.block_ids = DistinctIds(count, num_blocks, rng);
  return c;
}

}  // namespace

int CudaDeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

std::vector<CheckResult> CheckBlockCopy(uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<CopyCase> cases;
  cases.push_back(FlashAttentionCase(4, 40, 4096, 25, rng));
  {
    CopyCase c = FlashAttentionCase(2, 30, 32768, 17, rng);
    c.name += "/registered";
    c.registered = true;
    cases.push_back(c);
  }
  {
    // Blocks-first cache seen through its K half only: block_stride > block_bytes, and an odd
    // size and host offset (the unaligned path).
    CopyCase c;
    c.name = "strided-unaligned";
    const int num_blocks = 50;
    c.segments.push_back({0, 1000, 2048, 3});
    c.segments.push_back({num_blocks * 2048ull + 16, 4096, 8192, 1003});
    c.cache_bytes = num_blocks * 2048ull + 16 + num_blocks * 8192ull;
    c.object_bytes = 1003 + 4096 + 5;
    c.block_ids = DistinctIds(31, num_blocks, rng);
    cases.push_back(c);
  }
  {
    // More segments and blocks than one launch's parameters hold.
    CopyCase c;
    c.name = "many-launches";
    const int segs = 300, num_blocks = 2100;
    for (int s = 0; s < segs; ++s) {
      c.segments.push_back({uint64_t{1} * s * num_blocks * 64, 64, 64, uint64_t{1} * s * 64});
    }
    c.cache_bytes = uint64_t{1} * segs * num_blocks * 64;
    c.object_bytes = segs * 64;
    c.block_ids = DistinctIds(2000, num_blocks, rng);
    c.staging_objects = 700;
    cases.push_back(c);
  }
  std::vector<CheckResult> out;
  for (const CopyCase& c : cases) {
    for (CopyDirection dir : {CopyDirection::kDeviceToHost, CopyDirection::kHostToDevice}) {
      for (CopyMethod m :
           {CopyMethod::kKernel, CopyMethod::kCopyEngine, CopyMethod::kStaged, CopyMethod::kAuto}) {
        if (c.name == "many-launches" && m == CopyMethod::kAuto) continue;
        out.push_back(RunCopyCase(c, dir, m, rng));
      }
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// GQA decode

namespace {

enum class Layout { kKvFirst, kBlocksFirst, kPacked, kHeadsFirst };

const char* LayoutName(Layout l) {
  switch (l) {
    case Layout::kKvFirst:
      return "kv-first";
    case Layout::kBlocksFirst:
      return "blocks-first";
    case Layout::kPacked:
      return "packed";
    case Layout::kHeadsFirst:
      return "heads-first";
  }
  return "?";
}

struct GqaCase {
  int qo_heads, kv_heads, head_dim, block_size;
  DType kv_type, q_type;
  Layout layout;
  std::vector<int> lens;
  GqaDecodeOptions options = {};  // the planner's overrides (warps per block, chunk)
  std::string tag = "";           // what the case stands for (a benchmark row)
};

CheckResult RunGqaCase(const GqaCase& c, std::mt19937_64& rng) {
  CheckResult res;
  {
    std::ostringstream s;
    s << "gqa/" << c.qo_heads << "x" << c.kv_heads << "/d" << c.head_dim << "/bs" << c.block_size
      << "/" << DTypeName(c.kv_type) << (c.kv_type == DType::kFP8E4M3 ? "-q" : "")
      << (c.kv_type == DType::kFP8E4M3 ? DTypeName(c.q_type) : "") << "/" << LayoutName(c.layout)
      << (c.options.warps ? "/warps" + std::to_string(c.options.warps) : "")
      << (c.options.chunk ? "/chunk" + std::to_string(c.options.chunk) : "")
      << (c.options.rows8 ? "/rows8" : "")
      << (c.options.tile_warps ? "/tw" + std::to_string(c.options.tile_warps) : "")
      << (c.options.spans ? "/spans" : "")
      << (c.tag.empty() ? "" : "/" + c.tag) << "/batch" << c.lens.size();
    res.name = s.str();
  }
  const int batch = static_cast<int>(c.lens.size());
  const BlockTable bt = MakeBlockTable(c.lens, c.block_size, rng);
  const int d = c.head_dim, bs = c.block_size, h = c.kv_heads;
  PagedKvLayout layout;
  switch (c.layout) {
    case Layout::kKvFirst:
      layout = PagedKvLayout::KvFirst(bt.num_blocks, bs, h, d);
      break;
    case Layout::kBlocksFirst:
      layout = PagedKvLayout::BlocksFirst(bs, h, d);
      break;
    case Layout::kPacked:
      layout = PagedKvLayout::PackedLastDim(bs, h, d);
      break;
    case Layout::kHeadsFirst:  // (num_blocks, 2, kv_heads, block_size, d)
      layout = {int64_t{h} * bs * d, 2 * int64_t{h} * bs * d, d, int64_t{bs} * d};
      break;
  }
  const size_t cache_elems = size_t{2} * bt.num_blocks * bs * h * d;
  const int eb = DTypeBytes(c.kv_type);
  std::vector<uint8_t> cache(cache_elems * eb);
  FillNaN(cache.data(), cache_elems, c.kv_type);
  const bool fp8 = c.kv_type == DType::kFP8E4M3;
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  for (int b = 0; b < batch; ++b) {
    for (int t = 0; t < c.lens[b]; ++t) {
      const int64_t blk = bt.table[size_t{1} * b * bt.max_blocks_per_seq + t / bs];
      for (int kh = 0; kh < h; ++kh) {
        const int64_t row =
            blk * layout.block_stride + (t % bs) * layout.token_stride + kh * layout.head_stride;
        for (int j = 0; j < d; ++j) {
          StoreFromFloat(cache.data(), row + j, c.kv_type, unit(rng) * (fp8 ? 2.0f : 1.0f));
          StoreFromFloat(cache.data(), row + layout.v_offset + j, c.kv_type,
                         unit(rng) * (fp8 ? 2.0f : 1.0f));
        }
      }
    }
  }
  const size_t q_elems = size_t{1} * batch * c.qo_heads * d;
  std::vector<uint8_t> q(q_elems * 2);
  FillRandomValues(q.data(), q_elems, c.q_type, -2.0f, 2.0f, rng);
  GqaDecodeShape shape{batch, c.qo_heads, c.kv_heads, d, bs, bt.max_blocks_per_seq};
  AttentionScales scales{2.0f / std::sqrt(static_cast<float>(d)), fp8 ? 0.5f : 1.0f,
                         fp8 ? 0.25f : 1.0f};
  std::vector<float> o_ref(q_elems), lse_ref(size_t{1} * batch * c.qo_heads);
  CpuGqaDecode(q.data(), c.q_type, cache.data(), c.kv_type, layout, bt.table.data(), c.lens.data(),
               shape, scales, o_ref.data(), lse_ref.data());

  const int max_len = *std::max_element(c.lens.begin(), c.lens.end());
  DeviceBuffer d_cache, d_q, d_o, d_lse, d_table, d_lens, d_ws;
  const size_t ws_bytes = GqaDecodeWorkspaceBytes(shape, c.q_type, c.kv_type, max_len, c.options);
  if (ws_bytes == 0) {
    res.detail = "GqaDecodeWorkspaceBytes refused the configuration";
    return res;
  }
  CHECK_CUDA(res, d_cache.Alloc(cache.size()));
  CHECK_CUDA(res, d_q.Alloc(q.size()));
  CHECK_CUDA(res, d_o.Alloc(q.size()));
  CHECK_CUDA(res, d_lse.Alloc(lse_ref.size() * 4));
  CHECK_CUDA(res, d_table.Alloc(bt.table.size() * 4));
  CHECK_CUDA(res, d_lens.Alloc(c.lens.size() * 4));
  CHECK_CUDA(res, d_ws.Alloc(ws_bytes));
  CHECK_CUDA(res, cudaMemcpy(d_cache.ptr, cache.data(), cache.size(), cudaMemcpyHostToDevice));
  CHECK_CUDA(res, cudaMemcpy(d_q.ptr, q.data(), q.size(), cudaMemcpyHostToDevice));
  CHECK_CUDA(res,
             cudaMemcpy(d_table.ptr, bt.table.data(), bt.table.size() * 4, cudaMemcpyHostToDevice));
  CHECK_CUDA(res, cudaMemcpy(d_lens.ptr, c.lens.data(), c.lens.size() * 4, cudaMemcpyHostToDevice));
  CHECK_CUDA(res, cudaMemset(d_o.ptr, 0xff, q.size()));  // NaN: every output must be written
  CHECK_CUDA(res, cudaMemset(d_lse.ptr, 0xff, lse_ref.size() * 4));
  std::vector<uint8_t> o(q.size());
  std::vector<float> lse(lse_ref.size());
  double worst = 0.0;
  // Run 0: planned from the real lengths; run 1: the same plan again (the work counter must have
  // been reset); run 2: GqaDecode's plan for every sequence at max_len, in a workspace with room
  // for two partial results only, so long sequences take larger chunks.
  const size_t small_ws = std::min(
      ws_bytes,
      LayoutDecodeWorkspace((batch + 2) * int64_t{c.qo_heads}, batch, 2, c.qo_heads, d).total);
  GqaDecodePlan plan;
  if (KernelStatus st = PlanGqaDecode(shape, c.q_type, c.kv_type, c.lens.data(), max_len, d_ws.ptr,
                                      ws_bytes, nullptr, &plan, c.options);
      !st.ok()) {
    res.detail = "PlanGqaDecode: " + st.reason;
    return res;
  }
  for (int run = 0; run < 3; ++run) {
    CHECK_CUDA(res, cudaMemset(d_o.ptr, 0xff, q.size()));
    CHECK_CUDA(res, cudaMemset(d_lse.ptr, 0xff, lse_ref.size() * 4));
    if (run < 2) {
      const KernelStatus st =
          RunGqaDecode(plan, d_q.ptr, d_cache.ptr, layout, d_table.as<int32_t>(),
                       d_lens.as<int32_t>(), scales, d_o.ptr, d_lse.as<float>(), nullptr);
      if (!st.ok()) {
        res.detail = "RunGqaDecode: " + st.reason;
        return res;
      }
    } else {
      CHECK_CUDA(res, GqaDecode(d_q.ptr, c.q_type, d_cache.ptr, c.kv_type, layout,
                                d_table.as<int32_t>(), d_lens.as<int32_t>(), max_len, shape, scales,
                                d_o.ptr, d_lse.as<float>(), d_ws.ptr, small_ws, nullptr));
    }
    CHECK_CUDA(res, cudaDeviceSynchronize());
    CHECK_CUDA(res, cudaMemcpy(o.data(), d_o.ptr, o.size(), cudaMemcpyDeviceToHost));
    CHECK_CUDA(res, cudaMemcpy(lse.data(), d_lse.ptr, lse.size() * 4, cudaMemcpyDeviceToHost));
    if (!JudgeDecode(o.data(), lse, o_ref, lse_ref, c.q_type, c.kv_type, c.lens, worst, res)) {
      res.detail = (run == 2 ? "uniform plan, small workspace: " : "planned: ") + res.detail;
      break;
    }
  }
  if (res.ok) res.detail += "; " + DescribePlan(plan.split);
  res.error = worst;
  return res;
}

}  // namespace

// Configurations the kernels do not cover are refused by the planner with a reason that names
// the limit (not a bare cudaErrorInvalidValue), and the plan stays empty.
CheckResult CheckGqaRefusals() {
  CheckResult res;
  res.name = "gqa/refusals name their limit";
  struct Refusal {
    GqaDecodeShape shape;
    DType q, kv;
    GqaDecodeOptions options;
    const char* must_say;
  };
  GqaDecodeOptions shallow;
  shallow.warps = 1;
  shallow.stages = 3;
  GqaDecodeOptions eight;
  eight.warps = 8;
  GqaDecodeOptions tw3, tw2_pairs2, tw2_stages3;
  tw3.tile_warps = 3;
  tw2_pairs2.tile_warps = 2;
  tw2_pairs2.warps = 2;
  tw2_stages3.tile_warps = 2;
  tw2_stages3.stages = 3;
  const DType bf = DType::kBF16, e4 = DType::kFP8E4M3;
  const Refusal cases[] = {
      {{4, 32, 8, 96, 16, 8}, bf, bf, {}, "head_dim 96"},
      {{4, 30, 8, 128, 16, 8}, bf, bf, {}, "multiple of num_kv_heads"},
      {{4, 32, 8, 128, 24, 8}, bf, bf, {}, "block_size 24"},
      {{4, 32, 8, 128, 16, 8}, e4, e4, {}, "queries cannot be e4m3"},
      {{4, 8, 1, 128, 16, 8}, bf, e4, shallow, "3 stages"},
      {{4, 64, 8, 256, 16, 8}, bf, bf, eight, "warps per block"},
      {{4, 8, 1, 128, 16, 8}, bf, bf, tw3, "1, 2 or 4"},
      {{4, 16, 2, 128, 16, 8}, bf, bf, tw2_pairs2, "blocks of one kv head"},
      {{4, 8, 1, 128, 16, 8}, bf, bf, tw2_stages3, "4-stage rings only"},
  };
  DeviceBuffer ws;
  if (cudaMalloc(&ws.ptr, 1 << 20) != cudaSuccess) {
    res.detail = "cudaMalloc failed";
    return res;
  }
  int n = 0;
  for (const Refusal& c : cases) {
    GqaDecodePlan plan;
    const KernelStatus st =
        PlanGqaDecode(c.shape, c.q, c.kv, nullptr, 1024, ws.ptr, 1 << 20, nullptr, &plan,
                      c.options);
    if (st.ok() || st.reason.find(c.must_say) == std::string::npos ||
        st.cuda_error != cudaErrorInvalidValue || plan.workspace != nullptr) {
      res.detail = "case " + std::to_string(n) + ": expected a refusal naming '" + c.must_say +
                   "', got " + (st.ok() ? std::string("ok") : "'" + st.reason + "'");
      return res;
    }
    ++n;
  }
  res.ok = true;
  res.detail = std::to_string(n) + " refusals, each naming its limit";
  return res;
}

std::vector<CheckResult> CheckGqaDecode(uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<CheckResult> out;
  const DType kv_types[] = {DType::kBF16, DType::kFP16, DType::kFP8E4M3, DType::kFP8E4M3};
  const DType q_types[] = {DType::kBF16, DType::kFP16, DType::kBF16, DType::kFP16};
  const Layout layouts[] = {Layout::kKvFirst, Layout::kBlocksFirst, Layout::kPacked,
                            Layout::kHeadsFirst};
  const int heads[][2] = {{32, 8}, {64, 8}, {8, 8}, {32, 2}, {12, 4}};
  const int block_sizes[] = {16, 32, 64};
  int n = 0;
  for (int ti = 0; ti < 4; ++ti) {
    for (int d : {64, 128, 256}) {
      for (int li = 0; li < 4; ++li) {
        const int* hh = heads[n % 5];
        const int bs = block_sizes[(n / 5 + li) % 3];
        ++n;
        std::vector<int> lens = {
            1, bs, bs + 1, 3 * bs - 5, 77, 0, 200 + static_cast<int>(rng() % 100)};
        if (d == 256) lens.resize(4);
        out.push_back(
            RunGqaCase({hh[0], hh[1], d, bs, kv_types[ti], q_types[ti], layouts[li], lens}, rng));
      }
    }
  }
  // Long sequences: split across blocks and merged.
  out.push_back(RunGqaCase(
      {64, 8, 128, 16, DType::kBF16, DType::kBF16, Layout::kKvFirst, {4099, 1, 2500, 700}}, rng));
  // Forced chunks: more items than blocks, taken from the work counter.
  GqaDecodeOptions counter;
  counter.chunk = 128;
  out.push_back(RunGqaCase({64,
                            8,
                            128,
                            16,
                            DType::kBF16,
                            DType::kBF16,
                            Layout::kKvFirst,
                            {4099, 1, 2500, 700, 0, 3000, 4000, 4096},
                            counter},
                           rng));
  out.push_back(RunGqaCase({64,
                            8,
                            128,
                            64,
                            DType::kBF16,
                            DType::kBF16,
                            Layout::kBlocksFirst,
                            {3000, 17, 1, 0, 2049},
                            counter},
                           rng));
  // Eight heads per block.
  GqaDecodeOptions eight;
  eight.warps = 8;
  out.push_back(RunGqaCase({64,
                            8,
                            128,
                            32,
                            DType::kFP8E4M3,
                            DType::kBF16,
                            Layout::kBlocksFirst,
                            {1, 2500, 77, 0},
                            eight},
                           rng));
  out.push_back(RunGqaCase(
      {32, 8, 64, 16, DType::kBF16, DType::kBF16, Layout::kPacked, {300, 16, 1}, eight}, rng));
  out.push_back(RunGqaCase(
      {32, 8, 128, 64, DType::kFP8E4M3, DType::kBF16, Layout::kBlocksFirst, {3000, 5000}}, rng));
  out.push_back(RunGqaCase(
      {64, 4, 64, 32, DType::kFP16, DType::kFP16, Layout::kPacked, {1500, 17, 2048}}, rng));

  // Two threads planning and launching at once with different options (eight heads per block
  // and a forced chunk on one, the planner's choices on the other): the options travel in the
  // plans, so neither sees the other's (a process-global tuning struct used to be written by
  // every launch).
  {
    CheckResult first, second;
    std::mt19937_64 rng1(seed + 101), rng2(seed + 202);
    GqaDecodeOptions forced;
    forced.warps = 8;
    forced.chunk = 256;
    std::thread t1([&] {
      for (int i = 0; i < 4; ++i) {
        first = RunGqaCase({64, 8, 128, 16, DType::kBF16, DType::kBF16, Layout::kKvFirst,
                            {2000, 700, 1, 3000}, forced, "concurrent"},
                           rng1);
        if (!first.ok) break;
      }
    });
    std::thread t2([&] {
      for (int i = 0; i < 4; ++i) {
        second = RunGqaCase({32, 8, 64, 32, DType::kFP16, DType::kFP16, Layout::kBlocksFirst,
                             {1500, 9, 2600}, {}, "concurrent"},
                            rng2);
        if (!second.ok) break;
      }
    });
    t1.join();
    t2.join();
    out.push_back(first);
    out.push_back(second);
  }

  // The benchmark matrix's GQA rows (kvpool-kernels-bench), at their shapes or with fewer
  // sequences where the CPU reference would take too long: ragged lengths from SeededLengths.
  auto ragged = [](int batch, int lo, int hi, uint64_t s) {
    const std::vector<int32_t> l = SeededLengths(batch, lo, hi, s);
    return std::vector<int>(l.begin(), l.end());
  };
  const DType bf = DType::kBF16;
  out.push_back(RunGqaCase(
      {8, 1, 128, 16, bf, bf, Layout::kKvFirst, ragged(128, 512, 8192, 1), {}, "matrix-8/1-ragged"},
      rng));
  out.push_back(
      RunGqaCase({32, 8, 128, 16, bf, bf, Layout::kKvFirst, {131072}, {}, "matrix-one-128k"}, rng));
  out.push_back(RunGqaCase({32,
                            8,
                            128,
                            16,
                            bf,
                            bf,
                            Layout::kKvFirst,
                            ragged(16, 128, 16384, 3),
                            {},
                            "matrix-32/8-ragged-scaled"},
                           rng));
  out.push_back(RunGqaCase({32,
                            8,
                            128,
                            16,
                            bf,
                            bf,
                            Layout::kBlocksFirst,
                            ragged(16, 128, 16384, 4),
                            {},
                            "matrix-blocks-first-ragged-scaled"},
                           rng));
  // Odd and large groups, 1/2/4 kv heads, head dims 64 and 256.
  out.push_back(RunGqaCase(
      {28, 4, 128, 16, bf, bf, Layout::kKvFirst, ragged(16, 1, 6000, 5), {}, "matrix-group7"},
      rng));
  out.push_back(RunGqaCase({7,
                            1,
                            128,
                            32,
                            DType::kFP8E4M3,
                            bf,
                            Layout::kKvFirst,
                            ragged(16, 1, 6000, 6),
                            {},
                            "group7-1kv"},
                           rng));
  out.push_back(RunGqaCase(
      {48, 3, 128, 16, bf, bf, Layout::kPacked, ragged(8, 1, 5000, 7), {}, "group16"}, rng));
  // 16 query heads per warp (groups above 8, head_dim <= 128): groups 12, 16 and 32, e4m3, d64,
  // forced single-warp blocks; the 8-per-warp variant; d256 (8 per warp).
  GqaDecodeOptions one_warp, rows8;
  one_warp.warps = 1;
  rows8.rows8 = true;
  const DType e4 = DType::kFP8E4M3, h16 = DType::kFP16;
  const Layout kvf = Layout::kKvFirst;
  out.push_back(RunGqaCase(
      {16, 1, 64, 32, e4, bf, Layout::kBlocksFirst, ragged(16, 1, 7000, 11), {}, "g16-rows16"},
      rng));
  out.push_back(
      RunGqaCase({12, 1, 128, 16, h16, h16, kvf, ragged(8, 1, 3000, 12), {}, "g12-rows16"}, rng));
  out.push_back(RunGqaCase(
      {64, 2, 128, 16, bf, bf, Layout::kPacked, ragged(8, 1, 3000, 13), one_warp, "g32-rows16"},
      rng));
  out.push_back(
      RunGqaCase({16, 1, 128, 16, bf, bf, kvf, ragged(8, 1, 3000, 14), rows8, "g16-rows8"}, rng));
  // 1-warp blocks with 3-stage rings: 8 and 16 (rows16) query heads per warp, fp16 d64.
  GqaDecodeOptions shallow;
  shallow.warps = 1;
  shallow.stages = 3;
  out.push_back(RunGqaCase(
      {8, 1, 128, 16, bf, bf, kvf, ragged(12, 1, 5000, 16), shallow, "g8-1warp-3stages"}, rng));
  out.push_back(RunGqaCase(
      {16, 1, 128, 16, bf, bf, Layout::kBlocksFirst, ragged(8, 1, 4000, 17), shallow,
       "g16-1warp-3stages"},
      rng));
  out.push_back(RunGqaCase(
      {14, 2, 64, 32, h16, h16, Layout::kPacked, ragged(8, 1, 4000, 18), shallow,
       "g7-d64-1warp-3stages"},
      rng));
  out.push_back(
      RunGqaCase({32, 2, 256, 16, bf, bf, kvf, ragged(4, 1, 3000, 15), {}, "g16-d256"}, rng));
  out.push_back(RunGqaCase({10,
                            2,
                            64,
                            16,
                            DType::kFP16,
                            DType::kFP16,
                            Layout::kHeadsFirst,
                            ragged(16, 1, 9000, 8),
                            {},
                            "group5-2kv"},
                           rng));
  out.push_back(RunGqaCase(
      {16, 4, 256, 16, bf, bf, Layout::kKvFirst, ragged(8, 1, 8000, 9), {}, "matrix-d256-ragged"},
      rng));
  out.push_back(RunGqaCase({32,
                            8,
                            64,
                            16,
                            bf,
                            bf,
                            Layout::kKvFirst,
                            ragged(16, 128, 16384, 10),
                            {},
                            "matrix-d64-ragged-scaled"},
                           rng));
  // Several warps per kv head (tile_warps 2 and 4: each warp every 2nd or 4th tile, merged
  // through shared memory): groups 1, 7, 8, 16, head dims 64/128/256, bf16, fp16 and e4m3 (both
  // query types), every layout, ragged lengths with empty, one-token and shorter-than-the-warps
  // sequences; chained spans, and items from the work counter (forced chunks).
  for (int tw : {2, 4}) {
    GqaDecodeOptions o;
    o.tile_warps = tw;
    const std::vector<int> edge = {0, 1, 15, 16, 17, 47, 64, 65, 2500, 3001};
    out.push_back(RunGqaCase({8, 1, 128, 16, bf, bf, kvf, edge, o, "g8"}, rng));
    out.push_back(RunGqaCase(
        {7, 1, 64, 32, h16, h16, Layout::kBlocksFirst, ragged(12, 1, 5000, 21), o, "g7"}, rng));
    out.push_back(
        RunGqaCase({16, 1, 128, 16, e4, bf, kvf, ragged(8, 1, 4000, 22), o, "g16-rows16"}, rng));
    out.push_back(RunGqaCase(
        {4, 4, 128, 64, bf, bf, Layout::kHeadsFirst, ragged(6, 1, 3000, 23), o, "g1"}, rng));
    out.push_back(RunGqaCase(
        {32, 2, 256, 16, bf, bf, Layout::kPacked, ragged(4, 1, 3000, 24), o, "g16-d256"}, rng));
    out.push_back(
        RunGqaCase({16, 2, 64, 64, e4, h16, Layout::kBlocksFirst, edge, o, "g8-d64"}, rng));
    out.push_back(
        RunGqaCase({8, 1, 256, 32, e4, bf, kvf, ragged(6, 1, 4000, 25), o, "g8-d256"}, rng));
    out.push_back(
        RunGqaCase({48, 3, 128, 16, bf, bf, kvf, ragged(8, 1, 5000, 26), o, "g16-3kv"}, rng));
    out.push_back(RunGqaCase(
        {14, 2, 64, 16, e4, bf, Layout::kPacked, ragged(8, 1, 4000, 27), o, "g7-d64"}, rng));
    GqaDecodeOptions spans = o;
    spans.spans = true;
    out.push_back(
        RunGqaCase({8, 1, 128, 16, bf, bf, kvf, ragged(32, 1, 6000, 28), spans, "g8"}, rng));
    GqaDecodeOptions counter = o;
    counter.chunk = 128;
    out.push_back(
        RunGqaCase({16, 2, 128, 16, bf, bf, kvf, ragged(12, 1, 3000, 29), counter, "g8"}, rng));
  }
  {
    GqaDecodeOptions spans;
    spans.spans = true;
    out.push_back(RunGqaCase(
        {7, 1, 128, 16, bf, bf, Layout::kBlocksFirst, ragged(32, 1, 6000, 30), spans, "g7"}, rng));
  }
  // The few-splits merge: 1 to 32 splits per sequence (forced chunks), d64/128/256, bf16 and
  // fp16 outputs, empty and short sequences beside split ones; and the 8/1 matrix row's plan.
  {
    GqaDecodeOptions forced;
    forced.chunk = 128;
    const std::vector<int> lens = {0, 1, 129, 255, 1024, 1300, 2500, 4096};
    out.push_back(RunGqaCase({8, 1, 128, 16, bf, bf, kvf, lens, forced, "few-splits"}, rng));
    out.push_back(RunGqaCase(
        {32, 8, 64, 32, h16, h16, Layout::kBlocksFirst, lens, forced, "few-splits"}, rng));
    out.push_back(
        RunGqaCase({16, 4, 256, 16, bf, bf, Layout::kPacked, lens, forced, "few-splits"}, rng));
    out.push_back(RunGqaCase(
        {8, 1, 128, 16, bf, bf, kvf, ragged(128, 512, 8192, 1), {}, "few-splits-matrix"}, rng));
  }
  out.push_back(CheckGqaRefusals());
  return out;
}

// ---------------------------------------------------------------------------------------------
// MLA decode

namespace {

struct MlaCase {
  int heads, block_size;
  DType kv_type, q_type;
  std::vector<int> lens;
  int64_t pad = 0;  // elements between blocks beyond block_size * 576
  MlaDecodeOptions options = {};
  std::string tag = "";
  bool expect_spans = false;  // the planner must choose a span plan (chained items)
};

CheckResult RunMlaCase(const MlaCase& c, std::mt19937_64& rng) {
  CheckResult res;
  {
    std::ostringstream s;
    s << "mla/h" << c.heads << "/bs" << c.block_size << "/" << DTypeName(c.kv_type)
      << (c.kv_type == DType::kFP8E4M3 ? "-q" : "")
      << (c.kv_type == DType::kFP8E4M3 ? DTypeName(c.q_type) : "") << (c.pad ? "/padded" : "")
      << (c.options.heads_per_block ? "/hpb" + std::to_string(c.options.heads_per_block) : "")
      << (c.options.row_copies ? "/row-copies" : "") << (c.tag.empty() ? "" : "/" + c.tag)
      << "/batch" << c.lens.size();
    res.name = s.str();
  }
  const int batch = static_cast<int>(c.lens.size());
  const BlockTable bt = MakeBlockTable(c.lens, c.block_size, rng);
  const int64_t block_stride = int64_t{c.block_size} * kMlaKDim + c.pad;
  const size_t cache_elems = size_t{1} * bt.num_blocks * block_stride;
  const int eb = DTypeBytes(c.kv_type);
  const bool fp8 = c.kv_type == DType::kFP8E4M3;
  std::vector<uint8_t> cache(cache_elems * eb);
  FillNaN(cache.data(), cache_elems, c.kv_type);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  for (int b = 0; b < batch; ++b) {
    for (int t = 0; t < c.lens[b]; ++t) {
      const int64_t blk = bt.table[size_t{1} * b * bt.max_blocks_per_seq + t / c.block_size];
      const int64_t row = blk * block_stride + int64_t{t % c.block_size} * kMlaKDim;
      for (int j = 0; j < kMlaKDim; ++j) {
        StoreFromFloat(cache.data(), row + j, c.kv_type, unit(rng) * (fp8 ? 2.0f : 1.0f));
      }
    }
  }
  const size_t q_elems = size_t{1} * batch * c.heads * kMlaKDim;
  std::vector<uint8_t> q(q_elems * 2);
  FillRandomValues(q.data(), q_elems, c.q_type, -1.0f, 1.0f, rng);
  MlaDecodeShape shape{batch, c.heads, c.block_size, bt.max_blocks_per_seq, block_stride};
  AttentionScales scales{1.0f / std::sqrt(192.0f), fp8 ? 0.5f : 1.0f, fp8 ? 0.5f : 1.0f};
  const size_t o_elems = size_t{1} * batch * c.heads * kMlaVDim;
  std::vector<float> o_ref(o_elems), lse_ref(size_t{1} * batch * c.heads);
  CpuMlaDecode(q.data(), c.q_type, cache.data(), c.kv_type, bt.table.data(), c.lens.data(), shape,
               scales, o_ref.data(), lse_ref.data());

  const int max_len = *std::max_element(c.lens.begin(), c.lens.end());
  const size_t ws_bytes = MlaDecodeWorkspaceBytes(shape, c.q_type, c.kv_type, max_len, c.options);
  if (ws_bytes == 0) {
    res.detail = "MlaDecodeWorkspaceBytes refused the configuration";
    return res;
  }
  DeviceBuffer d_cache, d_q, d_o, d_lse, d_table, d_lens, d_ws;
  CHECK_CUDA(res, d_cache.Alloc(cache.size()));
  CHECK_CUDA(res, d_q.Alloc(q.size()));
  CHECK_CUDA(res, d_o.Alloc(o_elems * 2));
  CHECK_CUDA(res, d_lse.Alloc(lse_ref.size() * 4));
  CHECK_CUDA(res, d_table.Alloc(bt.table.size() * 4));
  CHECK_CUDA(res, d_lens.Alloc(c.lens.size() * 4));
  CHECK_CUDA(res, d_ws.Alloc(ws_bytes));
  CHECK_CUDA(res, cudaMemcpy(d_cache.ptr, cache.data(), cache.size(), cudaMemcpyHostToDevice));
  CHECK_CUDA(res, cudaMemcpy(d_q.ptr, q.data(), q.size(), cudaMemcpyHostToDevice));
  CHECK_CUDA(res,
             cudaMemcpy(d_table.ptr, bt.table.data(), bt.table.size() * 4, cudaMemcpyHostToDevice));
  CHECK_CUDA(res, cudaMemcpy(d_lens.ptr, c.lens.data(), c.lens.size() * 4, cudaMemcpyHostToDevice));
  CHECK_CUDA(res, cudaMemset(d_o.ptr, 0xff, o_elems * 2));
  CHECK_CUDA(res, cudaMemset(d_lse.ptr, 0xff, lse_ref.size() * 4));
  std::vector<uint8_t> o(o_elems * 2);
  std::vector<float> lse(lse_ref.size());
  double worst = 0.0;
  // Run 0: planned from the real lengths; run 1: the same plan again (the work counter must have
  // been reset); run 2: MlaDecode's plan for every sequence at max_len, in a workspace with room
  // for two partial results only.
  const size_t small_ws = std::min(
      ws_bytes,
      LayoutDecodeWorkspace((batch + 2) * int64_t{c.heads / 16}, batch, 2, c.heads, kMlaVDim)
          .total);
  MlaDecodePlan plan;
  if (KernelStatus st = PlanMlaDecode(shape, c.q_type, c.kv_type, c.lens.data(), max_len, d_ws.ptr,
                                      ws_bytes, nullptr, &plan, c.options);
      !st.ok()) {
    res.detail = "PlanMlaDecode: " + st.reason;
    return res;
  }
  if (c.expect_spans && !plan.split.spans) {
    res.detail = "expected a span plan, the planner chose " + DescribePlan(plan.split);
    return res;
  }
  for (int run = 0; run < 3; ++run) {
    CHECK_CUDA(res, cudaMemset(d_o.ptr, 0xff, o_elems * 2));
    CHECK_CUDA(res, cudaMemset(d_lse.ptr, 0xff, lse_ref.size() * 4));
    if (run < 2) {
      const KernelStatus st =
          RunMlaDecode(plan, d_q.ptr, d_cache.ptr, d_table.as<int32_t>(), d_lens.as<int32_t>(),
                       scales, d_o.ptr, d_lse.as<float>(), nullptr);
      if (!st.ok()) {
        res.detail = "RunMlaDecode: " + st.reason;
        return res;
      }
    } else {
      CHECK_CUDA(res, MlaDecode(d_q.ptr, c.q_type, d_cache.ptr, c.kv_type, d_table.as<int32_t>(),
                                d_lens.as<int32_t>(), max_len, shape, scales, d_o.ptr,
                                d_lse.as<float>(), d_ws.ptr, small_ws, nullptr));
    }
    CHECK_CUDA(res, cudaDeviceSynchronize());
    CHECK_CUDA(res, cudaMemcpy(o.data(), d_o.ptr, o.size(), cudaMemcpyDeviceToHost));
    CHECK_CUDA(res, cudaMemcpy(lse.data(), d_lse.ptr, lse.size() * 4, cudaMemcpyDeviceToHost));
    if (!JudgeDecode(o.data(), lse, o_ref, lse_ref, c.q_type, c.kv_type, c.lens, worst, res)) {
      res.detail = (run == 2 ? "uniform plan, small workspace: " : "planned: ") + res.detail;
      break;
    }
  }
  if (res.ok) res.detail += "; " + DescribePlan(plan.split);
  res.error = worst;
  return res;
}

}  // namespace

std::vector<CheckResult> CheckMlaDecode(uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<CheckResult> out;
  const DType kv_types[] = {DType::kBF16, DType::kFP16, DType::kFP8E4M3, DType::kFP8E4M3};
  const DType q_types[] = {DType::kBF16, DType::kFP16, DType::kBF16, DType::kFP16};
  const int heads[] = {16, 32, 64, 128};
  for (int ti = 0; ti < 4; ++ti) {
    for (int hi = 0; hi < 4; ++hi) {
      const int bs = (ti + hi) % 3 == 0 ? 64 : ((ti + hi) % 3 == 1 ? 32 : 16);
      std::vector<int> lens = {1, 64, 65, 190, 0, 97 + static_cast<int>(rng() % 64)};
      if (heads[hi] >= 64) lens.resize(3);
      out.push_back(
          RunMlaCase({heads[hi], bs, kv_types[ti], q_types[ti], lens, hi == 1 ? 64 : 0}, rng));
    }
  }
  out.push_back(RunMlaCase({16, 64, DType::kBF16, DType::kBF16, {3000, 1, 1700}}, rng));
  out.push_back(RunMlaCase({32, 64, DType::kFP8E4M3, DType::kBF16, {2500, 1200}}, rng));
  // Variants: 16 heads per block where 32 would do; row copies instead of tensor copies.
  MlaDecodeOptions by16;
  by16.heads_per_block = 16;
  out.push_back(RunMlaCase({64, 64, DType::kBF16, DType::kBF16, {2000, 5, 700}, 0, by16}, rng));
  MlaDecodeOptions rows;
  rows.row_copies = true;
  out.push_back(RunMlaCase({32, 64, DType::kBF16, DType::kBF16, {1300, 0, 64}, 0, rows}, rng));
  // The wgmma kernel (64 heads per block): short and empty sequences, long ones split and
  // merged, 64-, 32- and 16-token blocks (one, two or four tensor copies per slab), fp16.
  MlaDecodeOptions by64;
  by64.heads_per_block = 64;
  const DType b16 = DType::kBF16, f16 = DType::kFP16;
  out.push_back(RunMlaCase({64, 64, b16, b16, {1, 64, 65, 190, 0, 97}, 0, by64}, rng));
  out.push_back(RunMlaCase({64, 64, b16, b16, {20000, 3, 0, 129}, 0, by64}, rng));
  out.push_back(RunMlaCase({128, 32, b16, b16, {3000, 40}, 64, by64}, rng));
  out.push_back(RunMlaCase({128, 16, f16, f16, {5000, 77}, 0, by64}, rng));

  // The benchmark matrix's MLA rows, with fewer sequences where the CPU reference would take
  // too long; ragged lengths from SeededLengths.
  auto ragged = [](int batch, int lo, int hi, uint64_t s) {
    const std::vector<int32_t> l = SeededLengths(batch, lo, hi, s);
    return std::vector<int>(l.begin(), l.end());
  };
  const DType bf = DType::kBF16;
  out.push_back(
      RunMlaCase({128, 64, bf, bf, ragged(3, 1000, 8192, 21), 0, {}, "matrix-128h-scaled"}, rng));
  out.push_back(RunMlaCase({16, 64, bf, bf, {65536}, 0, {}, "matrix-one-64k"}, rng));
  out.push_back(
      RunMlaCase({16, 64, bf, bf, ragged(8, 1024, 16384, 22), 0, {}, "matrix-ragged-scaled"}, rng));
  // Batches ragged enough that the planner takes spans (one per block, sequences cut where a
  // span ends): the mma.sync kernel, the wgmma kernel; e4m3 (spans or not); the per-sequence
  // plan of the first batch.
  const std::vector<int> many = ragged(64, 64, 3000, 26);
  out.push_back(RunMlaCase({16, 64, bf, bf, many, 0, {}, "ragged-spans", true}, rng));
  out.push_back(RunMlaCase({64, 64, bf, bf, many, 0, {}, "ragged-wgmma-spans", true}, rng));
  out.push_back(RunMlaCase({32, 64, DType::kFP8E4M3, bf, many, 0, {}, "ragged-e4m3"}, rng));
  MlaDecodeOptions per_seq;
  per_seq.no_spans = true;
  out.push_back(RunMlaCase({16, 64, bf, bf, many, 0, per_seq, "ragged-per-seq"}, rng));
  out.push_back(RunMlaCase(
      {128, 64, DType::kFP8E4M3, bf, ragged(2, 1000, 4000, 23), 0, {}, "matrix-128h-e4m3"}, rng));
  // The wgmma kernel's rescale: lazy (the default: the running max kept unless a tile's is more
  // than 2^8 larger) on fp16, whose range is narrower, and eager (at every new maximum) on
  // partial last tiles, one-token and empty items, splits and spans.
  out.push_back(RunMlaCase({128, 16, f16, f16, {5000, 77, 129}, 0, by64, "lazy"}, rng));
  MlaDecodeOptions eager = by64;
  eager.eager_rescale = true;
  out.push_back(RunMlaCase({64, 64, b16, b16, {1, 64, 65, 190, 0, 9000}, 0, eager, "eager"}, rng));
  out.push_back(RunMlaCase({64, 64, bf, bf, many, 0, eager, "eager-spans", true}, rng));
  return out;
}

}  // namespace kvpool::kernels::testing
