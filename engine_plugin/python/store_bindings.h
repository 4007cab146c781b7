#pragma once

// kvpool.Store: the Mooncake-compatible store API (methods and return codes of
// mooncake.store.MooncakeDistributedStore) over engine::Store. Every blocking call releases
// the GIL.

#include <memory>

#include <pybind11/pybind11.h>

#include "engine_plugin/store.h"

namespace kvpool::engine::python {

// The Python object behind kvpool.Store: empty until setup() succeeds.
struct PyStore {
  std::shared_ptr<Store> store;
};

// Adds Store and its aliases to `m`.
void BindStore(pybind11::module_& m);

}  // namespace kvpool::engine::python
