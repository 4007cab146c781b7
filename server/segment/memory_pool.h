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

// 2 MiB: the huge page size a pool backed by huge pages uses, and so its size granule.
inline constexpr uint64_t kHugePageSize = 2ull << 20;

// Huge pages of 2 MiB that a new pool can still reserve on this machine (HugePages_Free less
// HugePages_Rsvd of /proc/meminfo: pages promised to mappings but not yet touched), -1 if
// unknown.
int64_t FreeHugePages();

struct MemoryPoolOptions {
  uint64_t size = 0;
  // Touch every page up front, so first accesses do not pay page faults: the kernel maps
  // them (MAP_POPULATE), then this process reads one byte of each page through its own
  // mapping. The second step matters on paravirtualised guests (this project's Firecracker
  // development VMs) whose host builds its shadow of a page-table entry only at the first
  // access from user space: MAP_POPULATE alone left about 9 us of hidden cost per 4 KiB page
  // to the first reader of each page (the commit check hashed at 0.5 GB/s instead of 10+,
  // docs/benchmarks.md). Several threads share the touching.
  bool prefault = true;
  // Back the pool with 2 MiB huge pages reserved by the kernel (vm.nr_hugepages): fewer TLB
  // misses and page-table walks on every copy, and memory that is never swapped. The size
  // must be a multiple of 2 MiB.
  bool hugepages = false;
  // Name of the memfd (shows in /proc/PID/maps).
  std::string name = "kvpool-pool";
};

class MemoryPool {
 public:
  // InvalidArgument for a size of 0 (or, with huge pages, not a multiple of 2 MiB);
  // ResourceExhausted when the memory cannot be had (with huge pages: fewer free than the
  // pool needs, the message says how many are free).
  static absl::StatusOr<std::unique_ptr<MemoryPool>> Create(const MemoryPoolOptions& options);
  ~MemoryPool();
  MemoryPool(const MemoryPool&) = delete;
  MemoryPool& operator=(const MemoryPool&) = delete;

  uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }
  int fd() const { return fd_; }
  bool hugepages() const { return hugepages_; }

  // Whether [offset, offset + length) lies inside the pool (safe against overflow).
  bool Contains(uint64_t offset, uint64_t length) const {
    return offset <= size_ && length <= size_ - offset;
  }

 private:
  MemoryPool(int fd, uint8_t* data, uint64_t size, bool hugepages)
      : fd_(fd), data_(data), size_(size), hugepages_(hugepages) {}

  const int fd_;
  uint8_t* const data_;
  const uint64_t size_;
  const bool hugepages_;
};

}  // namespace kvpool::segment
