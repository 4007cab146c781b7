#include "engine_plugin/python/py_ready_event.h"

#include "absl/strings/str_cat.h"

namespace py = pybind11;

namespace kvpool::engine::python {

PyReadyEvent::PyReadyEvent(py::object event) : event_(std::move(event)) {
  if (py::hasattr(event_, "synchronize")) {
    method_ = "synchronize";
  } else if (py::hasattr(event_, "wait")) {
    method_ = "wait";
  } else {
    throw py::value_error("a ready event needs a synchronize() or wait() method");
  }
}

PyReadyEvent::~PyReadyEvent() {
  if (!Py_IsInitialized()) {
    event_.release();  // the interpreter is gone; nothing to give back
    return;
  }
  py::gil_scoped_acquire gil;
  event_ = py::object();
}

absl::Status PyReadyEvent::Wait() {
  if (!Py_IsInitialized()) return absl::CancelledError("the Python interpreter is shutting down");
  py::gil_scoped_acquire gil;
  try {
    event_.attr(method_)();
  } catch (py::error_already_set& e) {
    return absl::InternalError(absl::StrCat("ready event ", method_, "() raised: ", e.what()));
  }
  return absl::OkStatus();
}

}  // namespace kvpool::engine::python
