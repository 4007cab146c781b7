// kvpool._kvpool: the compiled half of the `kvpool` Python package (engine_plugin/python/kvpool/
// holds the other). It binds the native store (kvpool.Store, kvpool's own return conventions),
// the engine plugin and the GPU pieces; kvpool/store.py builds Mooncake's
// MooncakeDistributedStore API, with Mooncake's conventions, on top of it.

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>

#include "common/net.h"
#include "engine_plugin/python/engine_bindings.h"
#include "engine_plugin/python/gpu_bindings.h"
#include "engine_plugin/python/store_bindings.h"
#include "kvpool/client.h"
#include "kvpool/v1/common.pb.h"

namespace py = pybind11;

PYBIND11_MODULE(_kvpool, m) {
  m.doc() = "kvpool's compiled bindings (import kvpool, not this)";
  kvpool::engine::python::BindStore(m);
  kvpool::engine::python::BindEngine(m);
  kvpool::engine::python::BindGpu(m);

  // One rule for which address a host name means, shared with the native store's setup:
  // kvpool/store.py resolves Mooncake's local_hostname with it. ValueError if it does not resolve.
  m.def(
      "resolve_host",
      [](const std::string& host) {
        absl::StatusOr<std::string> ip = kvpool::ResolveHost(host);
        if (!ip.ok()) throw py::value_error(std::string(ip.status().message()));
        return *ip;
      },
      py::arg("host"));

  m.attr("NO_AVAILABLE_HANDLE") = static_cast<int>(kvpool::v1::NO_AVAILABLE_HANDLE);
  m.attr("OBJECT_NOT_FOUND") = static_cast<int>(kvpool::v1::OBJECT_NOT_FOUND);
  m.attr("OBJECT_ALREADY_EXISTS") = static_cast<int>(kvpool::v1::OBJECT_ALREADY_EXISTS);
  m.attr("INVALID_PARAMS") = static_cast<int>(kvpool::v1::INVALID_PARAMS);
  m.attr("OBJECT_HAS_LEASE") = static_cast<int>(kvpool::v1::OBJECT_HAS_LEASE);
  m.attr("TASK_NOT_FOUND") = static_cast<int>(kvpool::v1::TASK_NOT_FOUND);
  m.def("error_code_name", &kvpool::ErrorCodeName, py::arg("code"),
        "The name of a numeric code: \"NO_AVAILABLE_HANDLE\" for -200.");
}
