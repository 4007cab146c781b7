#pragma once

// A ReadyEvent over a Python object: Wait() calls its synchronize() (torch.cuda.Event,
// torch.cuda.Stream) or, failing that, its wait() (threading.Event), holding the GIL only for
// that call. Safe to wait on and to destroy from any thread.

#include <pybind11/pybind11.h>

#include "engine_plugin/ready_event.h"

namespace kvpool::engine::python {

class PyReadyEvent : public ReadyEvent {
 public:
  // `event` must have synchronize() or wait(); checked here (ValueError otherwise).
  explicit PyReadyEvent(pybind11::object event);
  ~PyReadyEvent() override;
  absl::Status Wait() override;

 private:
  pybind11::object event_;
  const char* method_;
};

}  // namespace kvpool::engine::python
