// The `kvpool` Python module: the Mooncake-compatible store API and the engine plugin.
//
//   import kvpool
//   store = kvpool.MooncakeDistributedStore()      # or kvpool.Store()
//   store.setup({"master_server_address": "127.0.0.1:50051", "global_segment_size": "1GB"})
//
// `from kvpool.store import MooncakeDistributedStore` mirrors `from mooncake.store import ...`.

#include <pybind11/pybind11.h>

#include "engine_plugin/python/engine_bindings.h"
#include "engine_plugin/python/gpu_bindings.h"
#include "engine_plugin/python/store_bindings.h"
#include "kvpool/v1/common.pb.h"

namespace py = pybind11;

PYBIND11_MODULE(kvpool, m) {
  m.doc() = "kvpool: a distributed KV-cache pool for LLM inference engines";
  kvpool::engine::python::BindStore(m);
  kvpool::engine::python::BindEngine(m);
  kvpool::engine::python::BindGpu(m);

  m.attr("NO_AVAILABLE_HANDLE") = static_cast<int>(kvpool::v1::NO_AVAILABLE_HANDLE);
  m.attr("OBJECT_NOT_FOUND") = static_cast<int>(kvpool::v1::OBJECT_NOT_FOUND);
  m.attr("OBJECT_ALREADY_EXISTS") = static_cast<int>(kvpool::v1::OBJECT_ALREADY_EXISTS);
  m.attr("INVALID_PARAMS") = static_cast<int>(kvpool::v1::INVALID_PARAMS);
  m.attr("OBJECT_HAS_LEASE") = static_cast<int>(kvpool::v1::OBJECT_HAS_LEASE);

  // kvpool.store, importable as a module like mooncake.store.
  py::module_ store = m.def_submodule("store", "Mooncake-compatible store API");
  store.attr("MooncakeDistributedStore") = m.attr("Store");
  store.attr("Store") = m.attr("Store");
  py::module_::import("sys").attr("modules")["kvpool.store"] = store;
}
