#pragma once

#include <pybind11/pybind11.h>

namespace kvpool::engine::python {

// Adds GpuBlockMover (where the module is built with CUDA) and HAS_CUDA to `m`.
void BindGpu(pybind11::module_& m);

}  // namespace kvpool::engine::python
