// kvpool.GpuBlockMover: a GPU cache's blocks to and from same-machine pools in one copy.
//
//   mover = kvpool.GpuBlockMover(store, [k_cache_0, v_cache_0, ...], num_blocks, block_size,
//                                stream=torch.cuda.current_stream().cuda_stream)
//   mover.store_blocks(keys, block_ids)   # -> list of codes (0, -200, ...)
//   mover.load_blocks(keys, block_ids)

#include "engine_plugin/python/gpu_bindings.h"

#include <pybind11/stl.h>

#include "engine_plugin/python/engine_bindings.h"
#include "engine_plugin/python/store_bindings.h"

#ifdef KVPOOL_HAVE_CUDA
#include "engine_plugin/gpu_block_mover.h"
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
  cudaStream_t own_stream = nullptr;
  std::unique_ptr<GpuBlockMover> mover;

  ~PyGpuBlockMover() {
    mover.reset();
    if (own_stream != nullptr) cudaStreamDestroy(own_stream);
  }
};

std::vector<int> Codes(const std::vector<absl::Status>& results) {
  std::vector<int> codes;
  for (const absl::Status& status : results) codes.push_back(ToErrorCode(status));
  return codes;
}

}  // namespace
#endif

void BindGpu(py::module_& m) {
#ifdef KVPOOL_HAVE_CUDA
  m.attr("HAS_CUDA") = true;
  py::class_<PyGpuBlockMover>(m, "GpuBlockMover",
                              "Moves blocks of a GPU KV cache to and from pools on this machine "
                              "(shared memory) in one copy each way.")
      .def(py::init([](PyStore& store, py::handle tensors, uint64_t num_blocks,
                       uint32_t block_size, uintptr_t stream) {
             auto self = std::make_unique<PyGpuBlockMover>();
             self->store = store.store;
             if (self->store == nullptr) throw py::value_error("the store is not set up");
             self->client = self->store->client();
             if (self->client == nullptr) throw py::value_error("the store is closed");
             std::vector<TensorDesc> descs = ToTensorDescs(tensors, &self->tensors);
             absl::StatusOr<KvCacheLayout> layout =
                 KvCacheLayout::Detect(descs, num_blocks, block_size);
             if (!layout.ok()) throw py::value_error(std::string(layout.status().message()));
             cudaStream_t cuda_stream = reinterpret_cast<cudaStream_t>(stream);
             if (cuda_stream == nullptr) {
               cudaStreamCreateWithFlags(&self->own_stream, cudaStreamNonBlocking);
               cuda_stream = self->own_stream;
             }
             absl::StatusOr<std::unique_ptr<GpuBlockMover>> mover =
                 GpuBlockMover::Create(*self->client, *layout, cuda_stream);
             if (!mover.ok()) throw py::value_error(std::string(mover.status().message()));
             self->mover = std::move(*mover);
             return self;
           }),
           py::arg("store"), py::arg("tensors"), py::arg("num_blocks"), py::arg("block_size"),
           py::arg("stream") = 0)
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
      .def_property_readonly("bytes_per_block",
                             [](const PyGpuBlockMover& self) { return self.mover->bytes_per_block(); });
#else
  m.attr("HAS_CUDA") = false;
#endif
}

}  // namespace kvpool::engine::python
