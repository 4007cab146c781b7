#include "server/segment/memory_pool.h"

#include <fcntl.h>
#include <linux/memfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/size.h"

namespace kvpool::segment {

int64_t FreeHugePages() {
  std::ifstream meminfo("/proc/meminfo");
  std::string line;
  int64_t free_pages = -1;
  int64_t reserved = -1;
  while (std::getline(meminfo, line)) {
    absl::string_view rest = line;
    int64_t* field = absl::ConsumePrefix(&rest, "HugePages_Free:")   ? &free_pages
                     : absl::ConsumePrefix(&rest, "HugePages_Rsvd:") ? &reserved
                                                                     : nullptr;
    if (field != nullptr && !absl::SimpleAtoi(absl::StripAsciiWhitespace(rest), field)) {
      return -1;
    }
  }
  return free_pages < 0 || reserved < 0 ? -1 : free_pages - reserved;
}

namespace {

absl::Status HugePagesUnavailable(uint64_t size, int error) {
  int64_t free_pages = FreeHugePages();
  return absl::ResourceExhaustedError(absl::StrCat(
      "cannot back a pool of ", FormatSize(size), " with huge pages (", size / kHugePageSize,
      " of 2 MiB needed, ", free_pages < 0 ? std::string("unknown") : absl::StrCat(free_pages),
      " free): ", std::strerror(error),
      "; reserve more with sysctl vm.nr_hugepages, or run without --hugepages"));
}

// Reads one byte of every page through this process's mapping, on a few threads. (A read is
// enough for what the segment itself touches: the commit check reads; the data plane's
// payloads land by recv, through the kernel's own mapping. Measured on the development VM:
// 0.85 s per GiB, against 3.7 s for a write of each page.)
void TouchEveryPage(const uint8_t* data, uint64_t size, bool hugepages) {
  const uint64_t page = hugepages ? kHugePageSize : 4096;
  const uint64_t pages = (size + page - 1) / page;
  const uint64_t threads =
      std::clamp<uint64_t>(std::thread::hardware_concurrency(), 1, std::min<uint64_t>(8, pages));
  auto touch = [&](uint64_t first, uint64_t last) {
    uint8_t sum = 0;
    for (uint64_t i = first; i < last; ++i) {
      sum += *static_cast<const volatile uint8_t*>(data + i * page);
    }
    (void)sum;
  };
  std::vector<std::thread> helpers;
  const uint64_t share = (pages + threads - 1) / threads;
  for (uint64_t t = 1; t < threads; ++t) {
    helpers.emplace_back(touch, std::min(pages, t * share), std::min(pages, (t + 1) * share));
  }
  touch(0, std::min(pages, share));
  for (std::thread& helper : helpers) helper.join();
}

}  // namespace

absl::StatusOr<std::unique_ptr<MemoryPool>> MemoryPool::Create(const MemoryPoolOptions& options) {
  const uint64_t size = options.size;
  if (size == 0) return absl::InvalidArgumentError("pool size is 0");
  if (options.hugepages && size % kHugePageSize != 0) {
    return absl::InvalidArgumentError(absl::StrCat("a pool backed by huge pages must be a ",
                                                   "multiple of 2 MiB; ", FormatSize(size),
                                                   " (", size, " bytes) is not"));
  }
  unsigned memfd_flags =
      MFD_CLOEXEC | MFD_ALLOW_SEALING | (options.hugepages ? MFD_HUGETLB | MFD_HUGE_2MB : 0);
  int fd = memfd_create(options.name.c_str(), memfd_flags);
  if (fd < 0) {
    int error = errno;
    if (options.hugepages) return HugePagesUnavailable(size, error);
    return absl::ResourceExhaustedError(absl::StrCat("memfd_create: ", std::strerror(error)));
  }
  if (ftruncate(fd, static_cast<off_t>(size)) != 0) {
    int error = errno;
    close(fd);
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot size the pool to ", FormatSize(size), ": ", std::strerror(error)));
  }
  // The memfd is handed to same-host clients (shared memory): sealed, none of them can shrink
  // it (which would kill this process with SIGBUS on its next access) or grow it.
  if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    int error = errno;
    close(fd);
    return absl::InternalError(
        absl::StrCat("cannot seal the pool's memfd against resizing: ", std::strerror(error)));
  }
  // A shared huge-page mapping reserves all its pages here, so a shortage fails now (ENOMEM)
  // rather than as a SIGBUS on some later write.
  int flags = MAP_SHARED | (options.prefault ? MAP_POPULATE : 0);
  void* data = mmap(nullptr, size, PROT_READ | PROT_WRITE, flags, fd, 0);
  if (data == MAP_FAILED) {
    int error = errno;
    close(fd);
    if (options.hugepages) return HugePagesUnavailable(size, error);
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot map a pool of ", FormatSize(size), ": ", std::strerror(error)));
  }
  if (options.prefault) TouchEveryPage(static_cast<uint8_t*>(data), size, options.hugepages);
  return std::unique_ptr<MemoryPool>(
      new MemoryPool(fd, static_cast<uint8_t*>(data), size, options.hugepages));
}

MemoryPool::~MemoryPool() {
  munmap(data_, size_);
  close(fd_);
}

}  // namespace kvpool::segment
