#pragma once

#include <pybind11/pybind11.h>

#include <memory>

#include "engine_plugin/store.h"
#include "engine_plugin/store_worker.h"

namespace kvpool::engine::python {

// How StoreWorker moves the blocks of KV caches in CUDA memory on device `device`: a
// GpuBlockMover over the store's client, with its own store and load streams (same-host pools
// in one copy each way, others through pinned staging). Null where the module is built
// without CUDA.
StoreWorker::TransferFactory GpuTransferFactory(std::shared_ptr<Store> store, int device);

// Adds GpuBlockMover and the kernels' raw launchers (kvpool.ops wraps them as torch
// operations) where the module is built with CUDA, and HAS_CUDA, to `m`.
void BindGpu(pybind11::module_& m);

}  // namespace kvpool::engine::python
