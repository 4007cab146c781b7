#pragma once

// The checksum of a stored value: XXH3-64 over its bytes, in order, whatever buffers they
// are gathered from or scattered into. Computed by the writer, recorded by the master,
// checked by readers that ask for it, and by the segment at commit (docs/semantics.md).

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/types/span.h"

namespace kvpool::wire {

uint64_t Checksum(absl::Span<const iovec> parts);

// The same checksum, computed piece by piece as the bytes arrive: Digest() after Update of
// every piece in order equals Checksum of them all. Not thread-safe; about 600 bytes.
class ChecksumStream {
 public:
  ChecksumStream();
  ~ChecksumStream();
  ChecksumStream(const ChecksumStream&) = delete;
  ChecksumStream& operator=(const ChecksumStream&) = delete;

  // Starts a new value.
  void Reset();
  void Update(const void* data, size_t size);
  // The checksum of the bytes since Reset (the stream may go on).
  uint64_t Digest() const;

 private:
  struct State;
  struct Free {
    void operator()(State* state) const;
  };
  std::unique_ptr<State, Free> state_;
};

}  // namespace kvpool::wire
