#pragma once

// A completion the sending thread waits for before it reads KV cache memory: the engine's
// forward pass must have written the blocks. On a GPU this wraps a CUDA event recorded after
// the step's compute (the Python module wraps any object with synchronize(), such as
// torch.cuda.Event); on a CPU engine it can be a NotifiedReadyEvent or nothing at all.
// Implementations must allow Wait() from any thread, any number of times.

#include "absl/status/status.h"

namespace kvpool::engine {

class ReadyEvent {
 public:
  virtual ~ReadyEvent() = default;
  // Blocks until the memory is ready. An error means it never will be: the store is skipped.
  virtual absl::Status Wait() = 0;
};

}  // namespace kvpool::engine
