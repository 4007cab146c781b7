#pragma once

// The memory a segment contributes to the pool: one shared-memory file (memfd) mapped into
// the process, so that later a same-host client can map the very same pages.
// Thread-compatible: the pool itself is immutable after Create; who writes which byte range
// is decided by the master.

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace kvpool::segment {

class MemoryPool {
 public:
  // `prefault` touches every page up front, so first writes do not pay page faults.
  // InvalidArgument for a size of 0, ResourceExhausted when the memory cannot be had.
  static absl::StatusOr<std::unique_ptr<MemoryPool>> Create(uint64_t size, bool prefault,
                                                            const std::string& name);
  ~MemoryPool();
  MemoryPool(const MemoryPool&) = delete;
  MemoryPool& operator=(const MemoryPool&) = delete;

  uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }
  int fd() const { return fd_; }

  // Whether [offset, offset + length) lies inside the pool (safe against overflow).
  bool Contains(uint64_t offset, uint64_t length) const {
    return offset <= size_ && length <= size_ - offset;
  }

 private:
  MemoryPool(int fd, uint8_t* data, uint64_t size) : fd_(fd), data_(data), size_(size) {}

  const int fd_;
  uint8_t* const data_;
  const uint64_t size_;
};

}  // namespace kvpool::segment
