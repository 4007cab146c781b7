#include "server/segment/memory_pool.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/size.h"

namespace kvpool::segment {

absl::StatusOr<std::unique_ptr<MemoryPool>> MemoryPool::Create(uint64_t size, bool prefault,
                                                               const std::string& name) {
  if (size == 0) return absl::InvalidArgumentError("pool size is 0");
  int fd = memfd_create(name.c_str(), MFD_CLOEXEC);
  if (fd < 0) {
    return absl::ResourceExhaustedError(absl::StrCat("memfd_create: ", std::strerror(errno)));
  }
  if (ftruncate(fd, static_cast<off_t>(size)) != 0) {
    int error = errno;
    close(fd);
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot size the pool to ", FormatSize(size), ": ", std::strerror(error)));
  }
  int flags = MAP_SHARED | (prefault ? MAP_POPULATE : 0);
  void* data = mmap(nullptr, size, PROT_READ | PROT_WRITE, flags, fd, 0);
  if (data == MAP_FAILED) {
    int error = errno;
    close(fd);
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot map a pool of ", FormatSize(size), ": ", std::strerror(error)));
  }
  return std::unique_ptr<MemoryPool>(new MemoryPool(fd, static_cast<uint8_t*>(data), size));
}

MemoryPool::~MemoryPool() {
  munmap(data_, size_);
  close(fd_);
}

}  // namespace kvpool::segment
