// kvpool-gpu-e2e: the whole path on a GPU machine, against a running master and segment.
//
// Fills paged KV caches on the GPU with random data (a 32-layer GQA-8 d128 bf16 cache in
// FlashAttention's K/V-first layout, and an MLA latent cache), detects their layout with the
// engine plugin, runs GQA and MLA decode over them, stores every block in the pool (one copy
// from the GPU into a same-machine segment's shared memory), zeroes the GPU caches, looks the
// blocks up, loads them back (one copy from the pool into the GPU), checks the caches and the
// attention outputs are identical to the originals, and reports the load and store bandwidth
// next to a plain pinned-copy ceiling measured in the same run.
//
// Run by tests/gpu/run_gpu_e2e.sh. Exit status 0 only if everything is identical.

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/flags.h"
#include "engine_plugin/gpu_block_mover.h"
#include "engine_plugin/kv_cache_layout.h"
#include "engine_plugin/token_database.h"
#include "kernels/gqa_decode.cuh"
#include "kernels/mla_decode.cuh"
#include "kvpool/client.h"

ABSL_FLAG(std::string, master, "127.0.0.1:50051", "gRPC address of kvpool-master");
ABSL_FLAG(int, layers, 32, "GQA cache layers");
ABSL_FLAG(int, gqa_blocks, 1024, "Blocks of the GQA cache (16 tokens each)");
ABSL_FLAG(int, mla_blocks, 512, "Blocks of the MLA cache (64 tokens each)");
ABSL_FLAG(int, batch, 32, "Sequences of each decode step");
ABSL_FLAG(int, load_rounds, 3, "Times the whole cache is loaded (the best is reported)");
ABSL_FLAG(std::string, json, "", "Write the results here as JSON");

namespace {

using kvpool::kernels::DType;

#define CUDA_OK(call)                                                                     \
  do {                                                                                    \
    cudaError_t e_ = (call);                                                              \
    if (e_ != cudaSuccess) {                                                              \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call,                  \
                   cudaGetErrorString(e_));                                               \
      std::exit(2);                                                                       \
    }                                                                                     \
  } while (0)

__global__ void FillKernel(__nv_bfloat16* out, size_t n, uint64_t seed) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    uint64_t z = seed + i * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    out[i] = __float2bfloat16(static_cast<float>(z >> 40) / static_cast<float>(1 << 24) * 2 - 1);
  }
}

void Fill(void* device, size_t bytes, uint64_t seed, cudaStream_t stream) {
  FillKernel<<<1024, 256, 0, stream>>>(static_cast<__nv_bfloat16*>(device), bytes / 2, seed);
  CUDA_OK(cudaGetLastError());
}

std::vector<uint8_t> ToHost(const void* device, size_t bytes) {
  std::vector<uint8_t> host(bytes);
  CUDA_OK(cudaMemcpy(host.data(), device, bytes, cudaMemcpyDeviceToHost));
  return host;
}

double Seconds(absl::Time start) { return absl::ToDoubleSeconds(absl::Now() - start); }

// Median GB/s of a pinned copy of `bytes` in `kind` direction.
double PinnedCopyGBps(size_t bytes, cudaMemcpyKind kind, cudaStream_t stream) {
  void* host = nullptr;
  void* device = nullptr;
  CUDA_OK(cudaMallocHost(&host, bytes));
  CUDA_OK(cudaMalloc(&device, bytes));
  std::memset(host, 1, bytes);
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  std::vector<float> ms;
  for (int i = 0; i < 7; ++i) {
    cudaEventRecord(start, stream);
    if (kind == cudaMemcpyHostToDevice) {
      CUDA_OK(cudaMemcpyAsync(device, host, bytes, kind, stream));
    } else {
      CUDA_OK(cudaMemcpyAsync(host, device, bytes, kind, stream));
    }
    cudaEventRecord(stop, stream);
    cudaEventSynchronize(stop);
    float t = 0;
    cudaEventElapsedTime(&t, start, stop);
    if (i > 0) ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  cudaFreeHost(host);
  cudaFree(device);
  return static_cast<double>(bytes) / (ms[ms.size() / 2] / 1e3) / 1e9;
}

struct Attention {
  std::vector<uint8_t> gqa_out, gqa_lse, mla_out, mla_lse;
};

}  // namespace

int main(int argc, char** argv) {
  kvpool::ParseFlags(argc, argv);
  const int layers = absl::GetFlag(FLAGS_layers);
  const int gqa_blocks = absl::GetFlag(FLAGS_gqa_blocks);
  const int mla_blocks = absl::GetFlag(FLAGS_mla_blocks);
  const int batch = absl::GetFlag(FLAGS_batch);
  constexpr int kBlock = 16, kKvHeads = 8, kQoHeads = 64, kDim = 128;
  constexpr int kMlaBlock = 64, kMlaHeads = 16;
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  // --- The caches: one (2, blocks, 16, 8, 128) bf16 tensor per layer, one MLA tensor ---
  const size_t layer_bytes = size_t{2} * static_cast<size_t>(gqa_blocks) * kBlock * kKvHeads * kDim * 2;
  const size_t mla_bytes = static_cast<size_t>(mla_blocks) * kMlaBlock * kvpool::kernels::kMlaKDim * 2;
  std::vector<void*> gqa(layers);
  for (int l = 0; l < layers; ++l) {
    CUDA_OK(cudaMalloc(&gqa[l], layer_bytes));
    Fill(gqa[l], layer_bytes, 1000 + l, stream);
  }
  void* mla = nullptr;
  CUDA_OK(cudaMalloc(&mla, mla_bytes));
  Fill(mla, mla_bytes, 7, stream);
  CUDA_OK(cudaStreamSynchronize(stream));
  std::vector<std::vector<uint8_t>> original;
  for (int l = 0; l < layers; ++l) original.push_back(ToHost(gqa[l], layer_bytes));
  std::vector<uint8_t> original_mla = ToHost(mla, mla_bytes);

  // --- Layouts, detected by the engine plugin from the tensors' shapes and strides ---
  std::vector<kvpool::engine::TensorDesc> gqa_tensors;
  for (int l = 0; l < layers; ++l) {
    uint64_t ptr = reinterpret_cast<uint64_t>(gqa[l]);
    int64_t page = int64_t{kBlock} * kKvHeads * kDim;
    gqa_tensors.push_back({ptr, ptr, layer_bytes, {2, gqa_blocks, kBlock, kKvHeads, kDim},
                           {gqa_blocks * page, page, kKvHeads * kDim, kDim, 1}, 2,
                           absl::StrCat("layers.", l)});
  }
  absl::StatusOr<kvpool::engine::KvCacheLayout> gqa_layout =
      kvpool::engine::KvCacheLayout::Detect(gqa_tensors, gqa_blocks, kBlock);
  uint64_t mla_ptr = reinterpret_cast<uint64_t>(mla);
  absl::StatusOr<kvpool::engine::KvCacheLayout> mla_layout = kvpool::engine::KvCacheLayout::Detect(
      {{mla_ptr, mla_ptr, mla_bytes, {mla_blocks, kMlaBlock, kvpool::kernels::kMlaKDim},
        {kMlaBlock * kvpool::kernels::kMlaKDim, kvpool::kernels::kMlaKDim, 1}, 2, "mla"}},
      mla_blocks, kMlaBlock);
  if (!gqa_layout.ok() || !mla_layout.ok()) {
    std::fprintf(stderr, "layout: %s %s\n", gqa_layout.status().ToString().c_str(),
                 mla_layout.status().ToString().c_str());
    return 2;
  }
  std::printf("layouts: GQA %zu segments, %llu bytes per block; MLA %zu segment, %llu per block\n",
              gqa_layout->segments().size(),
              static_cast<unsigned long long>(gqa_layout->bytes_per_block()),
              mla_layout->segments().size(),
              static_cast<unsigned long long>(mla_layout->bytes_per_block()));

  // --- Attention over the original caches ---
  std::mt19937 rng(1);
  std::vector<int32_t> seq_lens(batch);
  const int gqa_max_blocks = std::min(gqa_blocks, 256);
  const int mla_max_blocks = std::min(mla_blocks, 128);
  std::vector<int32_t> gqa_table(static_cast<size_t>(batch) * gqa_max_blocks), mla_table(static_cast<size_t>(batch) * mla_max_blocks);
  std::vector<int32_t> mla_lens(batch);
  for (int b = 0; b < batch; ++b) {
    seq_lens[b] = 1 + rng() % (gqa_max_blocks * kBlock);  // ragged, not block multiples
    mla_lens[b] = 1 + rng() % (mla_max_blocks * kMlaBlock);
  }
  for (int32_t& id : gqa_table) id = rng() % gqa_blocks;
  for (int32_t& id : mla_table) id = rng() % mla_blocks;
  auto upload = [](const auto& host) {
    void* device = nullptr;
    size_t bytes = host.size() * sizeof(host[0]);
    CUDA_OK(cudaMalloc(&device, bytes));
    CUDA_OK(cudaMemcpy(device, host.data(), bytes, cudaMemcpyHostToDevice));
    return device;
  };
  void* d_gqa_table = upload(gqa_table);
  void* d_mla_table = upload(mla_table);
  void* d_seq = upload(seq_lens);
  void* d_mla_lens = upload(mla_lens);
  const size_t gqa_q_bytes = static_cast<size_t>(batch) * kQoHeads * kDim * 2;
  const size_t mla_q_bytes = static_cast<size_t>(batch) * kMlaHeads * kvpool::kernels::kMlaKDim * 2;
  const size_t mla_o_bytes = static_cast<size_t>(batch) * kMlaHeads * kvpool::kernels::kMlaVDim * 2;
  void *q, *o, *lse, *mq, *mo, *mlse;
  CUDA_OK(cudaMalloc(&q, gqa_q_bytes));
  CUDA_OK(cudaMalloc(&o, gqa_q_bytes));
  CUDA_OK(cudaMalloc(&lse, static_cast<size_t>(batch) * kQoHeads * 4));
  CUDA_OK(cudaMalloc(&mq, mla_q_bytes));
  CUDA_OK(cudaMalloc(&mo, mla_o_bytes));
  CUDA_OK(cudaMalloc(&mlse, static_cast<size_t>(batch) * kMlaHeads * 4));
  Fill(q, gqa_q_bytes, 99, stream);
  Fill(mq, mla_q_bytes, 98, stream);
  kvpool::kernels::GqaDecodeShape gqa_shape{batch, kQoHeads, kKvHeads, kDim, kBlock, gqa_max_blocks};
  kvpool::kernels::MlaDecodeShape mla_shape{batch, kMlaHeads, kMlaBlock, mla_max_blocks,
                                            int64_t{kMlaBlock} * kvpool::kernels::kMlaKDim};
  int gqa_max_len = gqa_max_blocks * kBlock, mla_max_len = mla_max_blocks * kMlaBlock;
  size_t ws_bytes = std::max(
      kvpool::kernels::GqaDecodeWorkspaceBytes(gqa_shape, DType::kBF16, DType::kBF16, gqa_max_len),
      kvpool::kernels::MlaDecodeWorkspaceBytes(mla_shape, DType::kBF16, DType::kBF16, mla_max_len));
  void* workspace = nullptr;
  CUDA_OK(cudaMalloc(&workspace, ws_bytes));
  auto attend = [&]() {
    kvpool::kernels::AttentionScales gqa_scales{1.0f / std::sqrt(float{kDim})};
    CUDA_OK(kvpool::kernels::GqaDecode(
        q, DType::kBF16, gqa[0], DType::kBF16,
        kvpool::kernels::PagedKvLayout::KvFirst(gqa_blocks, kBlock, kKvHeads, kDim),
        static_cast<int32_t*>(d_gqa_table), static_cast<int32_t*>(d_seq), gqa_max_len, gqa_shape,
        gqa_scales, o, static_cast<float*>(lse), workspace, ws_bytes, stream));
    kvpool::kernels::AttentionScales mla_scales{1.0f / std::sqrt(float{kvpool::kernels::kMlaKDim})};
    CUDA_OK(kvpool::kernels::MlaDecode(
        mq, DType::kBF16, mla, DType::kBF16, static_cast<int32_t*>(d_mla_table),
        static_cast<int32_t*>(d_mla_lens), mla_max_len, mla_shape, mla_scales, mo,
        static_cast<float*>(mlse), workspace, ws_bytes, stream));
    CUDA_OK(cudaStreamSynchronize(stream));
    return Attention{ToHost(o, gqa_q_bytes), ToHost(lse, static_cast<size_t>(batch) * kQoHeads * 4),
                     ToHost(mo, mla_o_bytes), ToHost(mlse, static_cast<size_t>(batch) * kMlaHeads * 4)};
  };
  Attention before = attend();

  // --- Store every block through the engine plugin ---
  kvpool::ClientOptions options;
  options.master_address = absl::GetFlag(FLAGS_master);
  absl::StatusOr<std::unique_ptr<kvpool::Client>> client = kvpool::Client::Create(options);
  if (!client.ok()) {
    std::fprintf(stderr, "client: %s\n", client.status().ToString().c_str());
    return 2;
  }
  auto gqa_mover = kvpool::engine::GpuBlockMover::Create(**client, *gqa_layout, stream);
  auto mla_mover = kvpool::engine::GpuBlockMover::Create(**client, *mla_layout, stream);
  if (!gqa_mover.ok() || !mla_mover.ok()) {
    std::fprintf(stderr, "mover: %s %s\n", gqa_mover.status().ToString().c_str(),
                 mla_mover.status().ToString().c_str());
    return 2;
  }
  kvpool::engine::KeyMetadata metadata;
  metadata.model_name = "e2e/llama-8b";
  auto keys_for = [&](const char* cache, int blocks) {
    std::vector<std::string> keys;
    for (int b = 0; b < blocks; ++b) {
      keys.push_back(kvpool::engine::PoolKey(metadata, absl::StrFormat("%s%08x", cache, b)));
    }
    return keys;
  };
  std::vector<std::string> gqa_keys = keys_for("a0", gqa_blocks), mla_keys = keys_for("b0", mla_blocks);
  std::vector<int32_t> gqa_ids(gqa_blocks), mla_ids(mla_blocks);
  for (int b = 0; b < gqa_blocks; ++b) gqa_ids[b] = b;
  for (int b = 0; b < mla_blocks; ++b) mla_ids[b] = b;
  const double gqa_total = static_cast<double>(gqa_layout->bytes_per_block()) * gqa_blocks;
  const double mla_total = static_cast<double>(mla_layout->bytes_per_block()) * mla_blocks;

  int failures = 0;
  auto count_failures = [&](const std::vector<absl::Status>& results, const char* what) {
    for (const absl::Status& status : results) {
      if (!status.ok()) {
        if (failures++ < 5) std::fprintf(stderr, "%s: %s\n", what, status.ToString().c_str());
      }
    }
  };
  absl::Time start = absl::Now();
  count_failures((*gqa_mover)->StoreBlocks(gqa_keys, gqa_ids), "store GQA");
  double store_s = Seconds(start);
  count_failures((*mla_mover)->StoreBlocks(mla_keys, mla_ids), "store MLA");

  // --- Zero the GPU, look the blocks up, load them back ---
  for (int l = 0; l < layers; ++l) CUDA_OK(cudaMemset(gqa[l], 0, layer_bytes));
  CUDA_OK(cudaMemset(mla, 0, mla_bytes));
  std::vector<std::string> all = gqa_keys;
  all.insert(all.end(), mla_keys.begin(), mla_keys.end());
  int found = 0;
  for (const absl::StatusOr<bool>& exists : (*client)->BatchExist(all)) found += exists.value_or(false);
  double best_load_s = 1e30;
  for (int round = 0; round < absl::GetFlag(FLAGS_load_rounds); ++round) {
    start = absl::Now();
    count_failures((*gqa_mover)->LoadBlocks(gqa_keys, gqa_ids), "load GQA");
    best_load_s = std::min(best_load_s, Seconds(start));
  }
  count_failures((*mla_mover)->LoadBlocks(mla_keys, mla_ids), "load MLA");

  // --- Identical? ---
  size_t differing_layers = 0;
  for (int l = 0; l < layers; ++l) differing_layers += ToHost(gqa[l], layer_bytes) != original[l];
  bool mla_same = ToHost(mla, mla_bytes) == original_mla;
  Attention after = attend();
  bool gqa_attention_same = after.gqa_out == before.gqa_out && after.gqa_lse == before.gqa_lse;
  bool mla_attention_same = after.mla_out == before.mla_out && after.mla_lse == before.mla_lse;

  // --- Ceilings measured now ---
  double h2d = PinnedCopyGBps(size_t{1} << 30, cudaMemcpyHostToDevice, stream);
  double d2h = PinnedCopyGBps(size_t{1} << 30, cudaMemcpyDeviceToHost, stream);
  double load_gbps = gqa_total / best_load_s / 1e9;
  double store_gbps = gqa_total / store_s / 1e9;
  bool ok = failures == 0 && found == static_cast<int>(all.size()) && differing_layers == 0 &&
            mla_same && gqa_attention_same && mla_attention_same;

  std::printf("\n| check | result |\n| --- | --- |\n");
  std::printf("| blocks stored and found (lookup) | %d of %zu |\n", found, all.size());
  std::printf("| GQA cache after load (%d layers, %.2f GiB) | %s |\n", layers, gqa_total / (1 << 30),
              differing_layers == 0 ? "identical" : absl::StrCat(differing_layers, " layers differ").c_str());
  std::printf("| MLA cache after load (%.1f MiB) | %s |\n", mla_total / (1 << 20),
              mla_same ? "identical" : "differs");
  std::printf("| GQA decode (64/8 heads, d128, block 16) over the loaded cache | %s |\n",
              gqa_attention_same ? "identical output and lse" : "differs");
  std::printf("| MLA decode (16 heads, block 64) over the loaded cache | %s |\n",
              mla_attention_same ? "identical output and lse" : "differs");
  std::printf("\n| path | GB/s | ratio to the pinned copy |\n| --- | --- | --- |\n");
  std::printf("| load: pool -> GPU cache (%llu-byte blocks, best of %d) | %.1f | %.2fx of %.1f |\n",
              static_cast<unsigned long long>(gqa_layout->bytes_per_block()),
              absl::GetFlag(FLAGS_load_rounds), load_gbps, load_gbps / h2d, h2d);
  std::printf("| store: GPU cache -> pool (once, with commit) | %.1f | %.2fx of %.1f |\n", store_gbps,
              store_gbps / d2h, d2h);
  std::printf("\n%s\n", ok ? "kvpool-gpu-e2e: PASS" : "kvpool-gpu-e2e: FAIL");
  std::string json_path = absl::GetFlag(FLAGS_json);
  if (!json_path.empty()) {
    std::ofstream(json_path) << absl::StrFormat(
        "{\"pass\":%s,\"found\":%d,\"keys\":%zu,\"gqa_layers_differing\":%zu,\"mla_same\":%s,"
        "\"gqa_attention_same\":%s,\"mla_attention_same\":%s,\"load_gbps\":%.3f,"
        "\"store_gbps\":%.3f,\"pinned_h2d_gbps\":%.3f,\"pinned_d2h_gbps\":%.3f,"
        "\"bytes_loaded\":%.0f}\n",
        ok ? "true" : "false", found, all.size(), differing_layers, mla_same ? "true" : "false",
        gqa_attention_same ? "true" : "false", mla_attention_same ? "true" : "false", load_gbps,
        store_gbps, h2d, d2h, gqa_total);
  }
  return ok ? 0 : 1;
}
