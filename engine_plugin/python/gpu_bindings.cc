// The GPU pieces of kvpool._kvpool (built where nvcc is; HAS_CUDA says whether):
//
//   kvpool.GpuBlockMover(store, [k_cache_0, v_cache_0, ...], num_blocks, block_size,
//                        stream=torch.cuda.current_stream().cuda_stream, force_remote=False,
//                        tcp=False, gpu_checksums=True)
//   mover.store_blocks(keys, block_ids)   # -> list of codes (0, -200, ...)
//   mover.load_blocks(keys, block_ids)
//
// and the kernels' raw launchers, which take addresses and sizes as plain integers:
// kvpool.ops (kvpool/ops.py) checks the torch tensors, derives layouts from their strides and
// calls these on the current torch stream. Each raises ValueError for a configuration the
// kernels refuse (with the kernels' reason) and RuntimeError for a CUDA error.
//
// StoreWorker's CUDA caches move through GpuTransferFactory (a GpuBlockMover per worker).

#include "engine_plugin/python/gpu_bindings.h"

#include <pybind11/stl.h>

#include <array>

#include "engine_plugin/python/engine_bindings.h"
#include "engine_plugin/python/store_bindings.h"

#ifdef KVPOOL_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"
#include "engine_plugin/gpu_block_mover.h"
#include "kernels/block_copy.cuh"
#include "kernels/checksum.cuh"
#include "kernels/gqa_decode.cuh"
#include "kernels/mla_decode.cuh"
#include "proto/checksum.h"
#include "proto/error_codes.h"
#endif

namespace py = pybind11;

namespace kvpool::engine::python {

#ifdef KVPOOL_HAVE_CUDA
namespace {

struct PyGpuBlockMover {
  std::shared_ptr<Store> store;
  std::shared_ptr<Client> client;
  std::vector<py::object> tensors;  // kept alive while blocks move
  std::unique_ptr<GpuBlockMover> mover;
};

// A GpuBlockMover that keeps the client it moves through alive.
class OwningGpuTransfer : public BlockTransfer {
 public:
  OwningGpuTransfer(std::shared_ptr<Client> client, std::unique_ptr<GpuBlockMover> mover)
      : client_(std::move(client)), mover_(std::move(mover)) {}
  ~OwningGpuTransfer() override { mover_.reset(); }
  std::vector<absl::Status> StoreBlocks(absl::Span<const std::string> keys,
                                        absl::Span<const int32_t> block_ids) override {
    return mover_->StoreBlocks(keys, block_ids);
  }
  std::vector<absl::Status> LoadBlocks(absl::Span<const std::string> keys,
                                       absl::Span<const int32_t> block_ids) override {
    return mover_->LoadBlocks(keys, block_ids);
  }
  std::unique_ptr<LayerwiseLoad> StartLayerwiseLoad(absl::Span<const std::string> keys,
                                                    absl::Span<const int32_t> block_ids) override {
    return mover_->StartLayerwiseLoad(keys, block_ids);
  }
  absl::Status WaitForLayer(int layer, uintptr_t stream) override {
    return mover_->WaitForLayer(layer, stream);
  }

 private:
  std::shared_ptr<Client> client_;
  std::unique_ptr<GpuBlockMover> mover_;
};

std::vector<int> Codes(const std::vector<absl::Status>& results) {
  std::vector<int> codes;
  for (const absl::Status& status : results) codes.push_back(ToErrorCode(status));
  return codes;
}

kernels::DType ParseDType(const std::string& name, const char* arg) {
  if (name == "bf16") return kernels::DType::kBF16;
  if (name == "fp16") return kernels::DType::kFP16;
  if (name == "fp8_e4m3") return kernels::DType::kFP8E4M3;
  throw py::value_error(absl::StrCat(arg, ": dtype ", name, " is not bf16, fp16 or fp8_e4m3"));
}

void ThrowKernel(const kernels::KernelStatus& st) {
  if (st.ok()) return;
  if (st.cuda_error == static_cast<int>(cudaErrorInvalidValue) && !st.reason.empty()) {
    throw py::value_error(st.reason);
  }
  throw std::runtime_error(absl::StrCat(
      st.reason.empty() ? "kernel launch failed" : st.reason, ": ",
      cudaGetErrorString(static_cast<cudaError_t>(st.cuda_error))));
}

void ThrowCuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(absl::StrCat(what, ": ", cudaGetErrorString(e)));
}

template <typename T>
T* Ptr(uintptr_t p) {
  return reinterpret_cast<T*>(p);
}
cudaStream_t Stream(uintptr_t s) { return reinterpret_cast<cudaStream_t>(s); }

kernels::GqaDecodeShape GqaShape(int batch, int qo_heads, int kv_heads, int head_dim,
                                 int block_size, int max_blocks_per_seq) {
  return kernels::GqaDecodeShape{batch, qo_heads, kv_heads, head_dim, block_size,
                                 max_blocks_per_seq};
}

// A plan the op layer keeps for every call of one shape (a decode step's layers, CUDA graph
// replays): planned once, outside any capture, into its own workspace.
struct PyGqaPlan {
  kernels::GqaDecodePlan plan;
};
struct PyMlaPlan {
  kernels::MlaDecodePlan plan;
};

// Median-free plain timing of `iters` back-to-back launches on `stream`, in ms per launch
// (after `warmup` untimed ones): what the C++ launcher costs without Python in between.
template <typename Launch>
double TimeLaunches(Launch launch, int warmup, int iters, cudaStream_t stream) {
  for (int i = 0; i < warmup; ++i) ThrowKernel(launch());
  cudaEvent_t start, stop;
  ThrowCuda(cudaEventCreate(&start), "creating an event");
  ThrowCuda(cudaEventCreate(&stop), "creating an event");
  cudaEventRecord(start, stream);
  for (int i = 0; i < iters; ++i) ThrowKernel(launch());
  cudaEventRecord(stop, stream);
  ThrowCuda(cudaEventSynchronize(stop), "timing launches");
  float ms = 0;
  cudaEventElapsedTime(&ms, start, stop);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return ms / iters;
}

void BindKernels(py::module_& m) {
  // --- GQA decode ---
  py::class_<PyGqaPlan>(m, "_GqaPlan")
      .def_property_readonly("description",
                             [](const PyGqaPlan& p) { return kernels::DescribePlan(p.plan.split); });
  m.def(
      "_gqa_decode_workspace_bytes",
      [](int batch, int qo_heads, int kv_heads, int head_dim, int block_size, int max_blocks,
         const std::string& q_dtype, const std::string& kv_dtype, int max_seq_len) {
        auto shape = GqaShape(batch, qo_heads, kv_heads, head_dim, block_size, max_blocks);
        kernels::DType q = ParseDType(q_dtype, "q"), kv = ParseDType(kv_dtype, "kv_cache");
        ThrowKernel(kernels::GqaDecodeSupported(shape, q, kv));
        return kernels::GqaDecodeWorkspaceBytes(shape, q, kv, max_seq_len);
      },
      py::arg("batch"), py::arg("num_qo_heads"), py::arg("num_kv_heads"), py::arg("head_dim"),
      py::arg("block_size"), py::arg("max_blocks_per_seq"), py::arg("q_dtype"),
      py::arg("kv_dtype"), py::arg("max_seq_len"));
  m.def(
      "_gqa_decode_plan",
      [](int batch, int qo_heads, int kv_heads, int head_dim, int block_size, int max_blocks,
         const std::string& q_dtype, const std::string& kv_dtype, int max_seq_len,
         uintptr_t workspace, size_t workspace_bytes, uintptr_t stream) {
        auto shape = GqaShape(batch, qo_heads, kv_heads, head_dim, block_size, max_blocks);
        PyGqaPlan p;
        ThrowKernel(kernels::PlanGqaDecode(shape, ParseDType(q_dtype, "q"),
                                           ParseDType(kv_dtype, "kv_cache"), nullptr, max_seq_len,
                                           Ptr<void>(workspace), workspace_bytes, Stream(stream),
                                           &p.plan));
        return p;
      },
      py::arg("batch"), py::arg("num_qo_heads"), py::arg("num_kv_heads"), py::arg("head_dim"),
      py::arg("block_size"), py::arg("max_blocks_per_seq"), py::arg("q_dtype"),
      py::arg("kv_dtype"), py::arg("max_seq_len"), py::arg("workspace"),
      py::arg("workspace_bytes"), py::arg("stream"));
  auto gqa_run = [](const PyGqaPlan& p, uintptr_t q, uintptr_t kv, std::array<int64_t, 4> layout,
                    uintptr_t block_tables, uintptr_t seq_lens, float sm_scale, float k_scale,
                    float v_scale, uintptr_t o, uintptr_t lse, uintptr_t stream) {
    kernels::PagedKvLayout l{layout[0], layout[1], layout[2], layout[3]};
    return kernels::RunGqaDecode(p.plan, Ptr<void>(q), Ptr<void>(kv), l,
                                 Ptr<int32_t>(block_tables), Ptr<int32_t>(seq_lens),
                                 kernels::AttentionScales{sm_scale, k_scale, v_scale},
                                 Ptr<void>(o), Ptr<float>(lse), Stream(stream));
  };
  m.def(
      "_gqa_decode_run",
      [gqa_run](const PyGqaPlan& p, uintptr_t q, uintptr_t kv, std::array<int64_t, 4> layout,
                uintptr_t block_tables, uintptr_t seq_lens, float sm_scale, float k_scale,
                float v_scale, uintptr_t o, uintptr_t lse, uintptr_t stream) {
        ThrowKernel(gqa_run(p, q, kv, layout, block_tables, seq_lens, sm_scale, k_scale, v_scale,
                            o, lse, stream));
      },
      py::arg("plan"), py::arg("q"), py::arg("kv_cache"), py::arg("layout"),
      py::arg("block_tables"), py::arg("seq_lens"), py::arg("sm_scale"), py::arg("k_scale"),
      py::arg("v_scale"), py::arg("o"), py::arg("lse"), py::arg("stream"),
      "RunGqaDecode; layout = (v_offset, block_stride, token_stride, head_stride) in elements.");
  m.def(
      "_gqa_decode_time",
      [gqa_run](const PyGqaPlan& p, uintptr_t q, uintptr_t kv, std::array<int64_t, 4> layout,
                uintptr_t block_tables, uintptr_t seq_lens, float sm_scale, uintptr_t o,
                uintptr_t lse, uintptr_t stream, int warmup, int iters) {
        py::gil_scoped_release release;
        return TimeLaunches(
            [&] {
              return gqa_run(p, q, kv, layout, block_tables, seq_lens, sm_scale, 1.0f, 1.0f, o,
                             lse, stream);
            },
            warmup, iters, Stream(stream));
      },
      py::arg("plan"), py::arg("q"), py::arg("kv_cache"), py::arg("layout"),
      py::arg("block_tables"), py::arg("seq_lens"), py::arg("sm_scale"), py::arg("o"),
      py::arg("lse"), py::arg("stream"), py::arg("warmup") = 10, py::arg("iters") = 100,
      "ms per RunGqaDecode launch, timed in C++ with CUDA events (no Python between launches).");

  // --- MLA decode ---
  py::class_<PyMlaPlan>(m, "_MlaPlan")
      .def_property_readonly("description",
                             [](const PyMlaPlan& p) { return kernels::DescribePlan(p.plan.split); });
  auto mla_shape = [](int batch, int heads, int block_size, int max_blocks, int64_t block_stride) {
    return kernels::MlaDecodeShape{batch, heads, block_size, max_blocks, block_stride};
  };
  m.def(
      "_mla_decode_workspace_bytes",
      [mla_shape](int batch, int heads, int block_size, int max_blocks, int64_t block_stride,
                  const std::string& q_dtype, const std::string& kv_dtype, int max_seq_len) {
        auto shape = mla_shape(batch, heads, block_size, max_blocks, block_stride);
        kernels::DType q = ParseDType(q_dtype, "q"), kv = ParseDType(kv_dtype, "kv_cache");
        ThrowKernel(kernels::MlaDecodeSupported(shape, q, kv));
        return kernels::MlaDecodeWorkspaceBytes(shape, q, kv, max_seq_len);
      },
      py::arg("batch"), py::arg("num_heads"), py::arg("block_size"),
      py::arg("max_blocks_per_seq"), py::arg("block_stride"), py::arg("q_dtype"),
      py::arg("kv_dtype"), py::arg("max_seq_len"));
  m.def(
      "_mla_decode_plan",
      [mla_shape](int batch, int heads, int block_size, int max_blocks, int64_t block_stride,
                  const std::string& q_dtype, const std::string& kv_dtype, int max_seq_len,
                  uintptr_t workspace, size_t workspace_bytes, uintptr_t stream) {
        PyMlaPlan p;
        ThrowKernel(kernels::PlanMlaDecode(
            mla_shape(batch, heads, block_size, max_blocks, block_stride),
            ParseDType(q_dtype, "q"), ParseDType(kv_dtype, "kv_cache"), nullptr, max_seq_len,
            Ptr<void>(workspace), workspace_bytes, Stream(stream), &p.plan));
        return p;
      },
      py::arg("batch"), py::arg("num_heads"), py::arg("block_size"),
      py::arg("max_blocks_per_seq"), py::arg("block_stride"), py::arg("q_dtype"),
      py::arg("kv_dtype"), py::arg("max_seq_len"), py::arg("workspace"),
      py::arg("workspace_bytes"), py::arg("stream"));
  auto mla_run = [](const PyMlaPlan& p, uintptr_t q, uintptr_t kv, uintptr_t block_tables,
                    uintptr_t seq_lens, float sm_scale, float k_scale, float v_scale, uintptr_t o,
                    uintptr_t lse, uintptr_t stream) {
    return kernels::RunMlaDecode(p.plan, Ptr<void>(q), Ptr<void>(kv), Ptr<int32_t>(block_tables),
                                 Ptr<int32_t>(seq_lens),
                                 kernels::AttentionScales{sm_scale, k_scale, v_scale},
                                 Ptr<void>(o), Ptr<float>(lse), Stream(stream));
  };
  m.def(
      "_mla_decode_run",
      [mla_run](const PyMlaPlan& p, uintptr_t q, uintptr_t kv, uintptr_t block_tables,
                uintptr_t seq_lens, float sm_scale, float k_scale, float v_scale, uintptr_t o,
                uintptr_t lse, uintptr_t stream) {
        ThrowKernel(
            mla_run(p, q, kv, block_tables, seq_lens, sm_scale, k_scale, v_scale, o, lse, stream));
      },
      py::arg("plan"), py::arg("q"), py::arg("kv_cache"), py::arg("block_tables"),
      py::arg("seq_lens"), py::arg("sm_scale"), py::arg("k_scale"), py::arg("v_scale"),
      py::arg("o"), py::arg("lse"), py::arg("stream"));
  m.def(
      "_mla_decode_time",
      [mla_run](const PyMlaPlan& p, uintptr_t q, uintptr_t kv, uintptr_t block_tables,
                uintptr_t seq_lens, float sm_scale, uintptr_t o, uintptr_t lse, uintptr_t stream,
                int warmup, int iters) {
        py::gil_scoped_release release;
        return TimeLaunches(
            [&] {
              return mla_run(p, q, kv, block_tables, seq_lens, sm_scale, 1.0f, 1.0f, o, lse,
                             stream);
            },
            warmup, iters, Stream(stream));
      },
      py::arg("plan"), py::arg("q"), py::arg("kv_cache"), py::arg("block_tables"),
      py::arg("seq_lens"), py::arg("sm_scale"), py::arg("o"), py::arg("lse"), py::arg("stream"),
      py::arg("warmup") = 10, py::arg("iters") = 100);

  // --- Block copies ---
  m.def(
      "_copy_blocks",
      [](std::vector<uint64_t> bases, std::vector<uint64_t> block_bytes,
         std::vector<int32_t> block_ids, uintptr_t objects, uint64_t object_stride,
         bool to_cache, uintptr_t stream) {
        if (bases.size() != block_bytes.size()) {
          throw py::value_error("bases and block_bytes differ in length");
        }
        std::vector<kernels::KvSegment> segments;
        uint64_t offset = 0;
        for (size_t s = 0; s < bases.size(); ++s) {
          segments.push_back(kernels::KvSegment{bases[s], block_bytes[s], block_bytes[s], offset});
          offset += block_bytes[s];
        }
        if (offset > object_stride) {
          throw py::value_error(absl::StrCat("blocks: rows of ", object_stride,
                                             " bytes cannot hold a block of ", offset));
        }
        std::vector<uint8_t*> hosts;
        for (size_t i = 0; i < block_ids.size(); ++i) {
          hosts.push_back(Ptr<uint8_t>(objects + i * object_stride));
        }
        ThrowCuda(kernels::CopyBlocks(segments.data(), static_cast<int>(segments.size()),
                                      block_ids.data(), hosts.data(),
                                      static_cast<int>(block_ids.size()),
                                      to_cache ? kernels::CopyDirection::kHostToDevice
                                               : kernels::CopyDirection::kDeviceToHost,
                                      kernels::CopyMethod::kKernel, kernels::CopyStaging{},
                                      Stream(stream)),
                  "copying blocks");
      },
      py::arg("bases"), py::arg("block_bytes"), py::arg("block_ids"), py::arg("objects"),
      py::arg("object_stride"), py::arg("to_cache"), py::arg("stream"),
      "CopyBlocks (kKernel) between segments of a device cache and rows of `objects`.");

  // --- checksums (the store's XXH3-64), for tests and benchmarks ---
  m.def(
      "_checksum_on_gpu",
      [](uintptr_t data, uint64_t bytes, uintptr_t stream) {
        uint64_t* sum = nullptr;
        ThrowCuda(cudaHostAlloc(reinterpret_cast<void**>(&sum), sizeof(uint64_t),
                                cudaHostAllocDefault),
                  "allocating a checksum");
        cudaError_t e = kernels::ChecksumBuffer(Ptr<const void>(data), bytes, sum, Stream(stream));
        if (e == cudaSuccess) e = cudaStreamSynchronize(Stream(stream));
        const uint64_t value = *sum;
        cudaFreeHost(sum);
        ThrowCuda(e, "checksumming on the GPU");
        return value;
      },
      py::arg("data"), py::arg("bytes"), py::arg("stream"),
      "XXH3-64 of `bytes` bytes of device memory, computed on the GPU (waits for it).");
  m.def(
      "_checksum_blocks_time",
      [](const std::vector<uintptr_t>& bases, const std::vector<uint64_t>& block_bytes,
         const std::vector<uint64_t>& block_strides, const std::vector<int32_t>& block_ids,
         int iterations) {
        if (bases.size() != block_bytes.size() || bases.size() != block_strides.size()) {
          throw py::value_error("bases, block_bytes and block_strides differ in length");
        }
        std::vector<kernels::KvSegment> segments;
        uint64_t offset = 0;
        for (size_t i = 0; i < bases.size(); ++i) {
          segments.push_back({bases[i], block_bytes[i], block_strides[i], offset});
          offset += block_bytes[i];
        }
        uint64_t* sums = nullptr;
        ThrowCuda(cudaMalloc(reinterpret_cast<void**>(&sums),
                             std::max<size_t>(1, block_ids.size()) * sizeof(uint64_t)),
                  "allocating checksums");
        cudaStream_t stream = nullptr;
        ThrowCuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "creating a stream");
        cudaEvent_t start, stop;
        ThrowCuda(cudaEventCreate(&start), "creating an event");
        ThrowCuda(cudaEventCreate(&stop), "creating an event");
        auto launch = [&] {
          ThrowCuda(kernels::ChecksumBlocks(segments.data(), static_cast<int>(segments.size()),
                                            block_ids.data(), static_cast<int>(block_ids.size()),
                                            sums, stream),
                    "checksumming blocks");
        };
        launch();  // warm-up
        ThrowCuda(cudaEventRecord(start, stream), "timing");
        for (int i = 0; i < iterations; ++i) launch();
        ThrowCuda(cudaEventRecord(stop, stream), "timing");
        ThrowCuda(cudaEventSynchronize(stop), "timing");
        float ms = 0;
        cudaEventElapsedTime(&ms, start, stop);
        cudaEventDestroy(start);
        cudaEventDestroy(stop);
        cudaStreamDestroy(stream);
        cudaFree(sums);
        return ms * 1000.0 / std::max(1, iterations);
      },
      py::arg("bases"), py::arg("block_bytes"), py::arg("block_strides"), py::arg("block_ids"),
      py::arg("iterations"),
      "Microseconds per ChecksumBlocks call over these blocks (CUDA events, back to back).");
}

}  // namespace

StoreWorker::TransferFactory GpuTransferFactory(std::shared_ptr<Store> store, int device) {
  return [store = std::move(store),
          device](const KvCacheLayout& layout) -> absl::StatusOr<std::unique_ptr<BlockTransfer>> {
    std::shared_ptr<Client> client = store->client();
    if (client == nullptr) return absl::FailedPreconditionError("the store is closed");
    if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess) {
      return absl::InternalError(absl::StrCat("selecting cuda:", device, ": ",
                                              cudaGetErrorString(e)));
    }
    absl::StatusOr<std::unique_ptr<GpuBlockMover>> mover =
        GpuBlockMover::Create(*client, layout, GpuBlockMoverOptions{});
    if (!mover.ok()) return mover.status();
    return std::unique_ptr<BlockTransfer>(
        std::make_unique<OwningGpuTransfer>(std::move(client), *std::move(mover)));
  };
}
#else
StoreWorker::TransferFactory GpuTransferFactory(std::shared_ptr<Store>, int) { return nullptr; }
#endif

void BindGpu(py::module_& m) {
#ifdef KVPOOL_HAVE_CUDA
  m.attr("HAS_CUDA") = true;
  BindKernels(m);
  m.def(
      "_checksum",
      [](const std::string& data) {
        py::gil_scoped_release release;
        return wire::Checksum({iovec{const_cast<char*>(data.data()), data.size()}});
      },
      py::arg("data"), "The store's checksum (XXH3-64, libxxhash on the CPU) of `data`.");
  m.def(
      "_corrupt_pooled_object",
      [](PyStore& store, const std::string& key, uint64_t offset) {
        std::shared_ptr<Client> client = store.store ? store.store->client() : nullptr;
        if (client == nullptr) throw py::value_error("the store is closed");
        absl::Time lease;
        std::vector<absl::StatusOr<LocalValue>> located = client->BatchGetLocal({key}, &lease);
        if (!located[0].ok()) throw std::runtime_error(located[0].status().ToString());
        if (offset >= located[0]->size) throw py::value_error("offset past the object's end");
        located[0]->data[offset] ^= 0xff;
      },
      py::arg("store"), py::arg("key"), py::arg("offset"),
      "For tests: flips the bits of one byte of `key`'s replica in a pool of this machine (as a "
      "faulty writer or memory would), after its commit.");
  py::class_<PyGpuBlockMover>(m, "GpuBlockMover",
                              "Moves blocks of a GPU KV cache to and from the pool: pools on this "
                              "machine (shared memory) in one copy each way, others through "
                              "pinned staging.")
      .def(py::init([](PyStore& store, py::handle tensors, uint64_t num_blocks,
                       uint32_t block_size, uintptr_t stream, bool force_remote, bool tcp,
                       bool gpu_checksums, size_t first_batch_blocks, size_t batch_blocks,
                       size_t last_batch_blocks, size_t staged_first_batch_blocks) {
             auto self = std::make_unique<PyGpuBlockMover>();
             self->store = store.store;
             if (self->store == nullptr) throw py::value_error("the store is not set up");
             self->client = self->store->client();
             if (self->client == nullptr) throw py::value_error("the store is closed");
             if (tcp) {
               // A client of its own that moves every byte over TCP, even to this host's pools.
               ClientOptions options;
               options.master_address = self->store->config().master_server_address;
               options.transport = TransportKind::kTcp;
               absl::StatusOr<std::unique_ptr<Client>> client = Client::Create(options);
               if (!client.ok()) throw std::runtime_error(client.status().ToString());
               self->client = std::shared_ptr<Client>(std::move(*client));
               force_remote = true;
             }
             std::vector<TensorDesc> descs = ToTensorDescs(tensors, &self->tensors);
             absl::StatusOr<KvCacheLayout> layout =
                 KvCacheLayout::Detect(descs, num_blocks, block_size);
             if (!layout.ok()) throw py::value_error(std::string(layout.status().message()));
             cudaStream_t cuda_stream = reinterpret_cast<cudaStream_t>(stream);
             absl::StatusOr<std::unique_ptr<GpuBlockMover>> mover = GpuBlockMover::Create(
                 *self->client, *layout,
                 GpuBlockMoverOptions{.store_stream = cuda_stream,
                                      .load_stream = cuda_stream,
                                      .force_remote = force_remote,
                                      .gpu_checksums = gpu_checksums,
                                      .first_batch_blocks = first_batch_blocks,
                                      .batch_blocks = batch_blocks,
                                      .last_batch_blocks = last_batch_blocks,
                                      .staged_first_batch_blocks = staged_first_batch_blocks});
             if (!mover.ok()) throw std::runtime_error(std::string(mover.status().message()));
             self->mover = std::move(*mover);
             return self;
           }),
           py::arg("store"), py::arg("tensors"), py::arg("num_blocks"), py::arg("block_size"),
           py::arg("stream") = 0, py::arg("force_remote") = false, py::arg("tcp") = false,
           py::arg("gpu_checksums") = true,
           py::arg("first_batch_blocks") = GpuBlockMoverOptions{}.first_batch_blocks,
           py::arg("batch_blocks") = GpuBlockMoverOptions{}.batch_blocks,
           py::arg("last_batch_blocks") = GpuBlockMoverOptions{}.last_batch_blocks,
           py::arg("staged_first_batch_blocks") = GpuBlockMoverOptions{}.staged_first_batch_blocks,
           "force_remote: every block through pinned staging and the client (as for another "
           "machine's pool); tcp: that, with a client of the mover's own that uses TCP only; "
           "gpu_checksums=False: same-host stores hashed by the CPU at commit, loads unchecked; "
           "first_batch_blocks, batch_blocks, last_batch_blocks (0: no limit): how calls are "
           "cut into pool round trips; staged_first_batch_blocks: a store's first batch instead, "
           "copied through the pinned buffer before its space is known (0: none) "
           "(GpuBlockMoverOptions).")
      .def("store_blocks",
           [](PyGpuBlockMover& self, const std::vector<std::string>& keys,
              const std::vector<int32_t>& block_ids) {
             if (keys.size() != block_ids.size()) {
               throw py::value_error("keys and block_ids differ in length");
             }
             py::gil_scoped_release release;
             return Codes(self.mover->StoreBlocks(keys, block_ids));
           })
      .def("load_blocks",
           [](PyGpuBlockMover& self, const std::vector<std::string>& keys,
              const std::vector<int32_t>& block_ids) {
             if (keys.size() != block_ids.size()) {
               throw py::value_error("keys and block_ids differ in length");
             }
             py::gil_scoped_release release;
             return Codes(self.mover->LoadBlocks(keys, block_ids));
           })
      .def("locate",
           [](PyGpuBlockMover& self, const std::vector<std::string>& keys) {
             py::gil_scoped_release release;
             std::optional<std::vector<bool>> present = self.mover->Locate(keys);
             return present.value_or(std::vector<bool>());
           },
           py::arg("keys"),
           "Whether the pool holds each key; keeps the leased locations of keys on this "
           "machine's pools for the next load of them (StoreWorker.lookup does this). [] with "
           "force_remote or tcp.")
      .def("phase_times",
           [](PyGpuBlockMover& self) {
             auto as_dict = [](const MoverPhaseTimes& t) {
               py::dict d;
               d["master_ms"] = absl::ToDoubleMilliseconds(t.master);
               d["launch_ms"] = absl::ToDoubleMilliseconds(t.launch);
               d["wait_ms"] = absl::ToDoubleMilliseconds(t.wait);
               d["commit_ms"] = absl::ToDoubleMilliseconds(t.commit);
               d["total_ms"] = absl::ToDoubleMilliseconds(t.total);
               d["to_first_copy_ms"] = absl::ToDoubleMilliseconds(t.to_first_copy);
               d["after_last_copy_ms"] = absl::ToDoubleMilliseconds(t.after_last_copy);
               d["calls"] = t.calls;
               d["blocks"] = t.blocks;
               return d;
             };
             py::dict d;
             d["store"] = as_dict(self.mover->store_times());
             d["load"] = as_dict(self.mover->load_times());
             return d;
           },
           "Where the calls spent their time so far, per direction (wall clock, ms): master "
           "(reserve or locate), launch (queuing GPU work), wait (for the GPU), commit (stores); "
           "of the total, to_first_copy (until the first copy was queued) and after_last_copy "
           "(stores: from the last copy's end to the return).")
      .def_property_readonly("bytes_per_block",
                             [](const PyGpuBlockMover& self) { return self.mover->bytes_per_block(); });
#else
  m.attr("HAS_CUDA") = false;
#endif
}

}  // namespace kvpool::engine::python
