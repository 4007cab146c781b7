#pragma once

// The engine pieces for Python engines: TensorDesc (from torch tensors or plain numbers),
// detect_layout, KeyMetadata/TokenDatabase, LoadSpec/ReqMeta and StoreWorker. Errors raise
// ValueError (bad arguments) or RuntimeError; blocking calls release the GIL.

#include <pybind11/pybind11.h>

namespace kvpool::engine::python {

void BindEngine(pybind11::module_& m);

}  // namespace kvpool::engine::python
