#pragma once

// The engine pieces for Python engines: TensorDesc (from torch tensors or plain numbers),
// detect_layout, KeyMetadata/TokenDatabase, LoadSpec/ReqMeta and StoreWorker. Errors raise
// ValueError (bad arguments) or RuntimeError; blocking calls release the GIL.

#include <pybind11/pybind11.h>

#include <vector>

#include "engine_plugin/kv_cache_layout.h"

namespace kvpool::engine::python {

void BindEngine(pybind11::module_& m);

// Tensors from a dict {layer name: tensor}, a list, or one tensor (torch tensors or
// TensorDescs); `objects` gets every Python object (to keep tensors alive while their memory
// is in use).
std::vector<TensorDesc> ToTensorDescs(pybind11::handle tensors,
                                      std::vector<pybind11::object>* objects);

}  // namespace kvpool::engine::python
