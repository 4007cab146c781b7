#pragma once

// Lets the Store's raw-pointer calls (Mooncake's put_from / get_into families, which engines
// give the addresses of their GPU KV cache) take device memory as well as host memory. The
// client moves bytes with the CPU and sockets, which cannot touch device memory; so a call's
// device parts are copied into pinned host memory before a put, and out of it after a get,
// with the CUDA driver (CudaDriver: no CUDA toolkit needed at build time, no context created).
//
// The copies of one call are sorted by device address and adjacent ones merged (the blocks of
// one layer that neighbour each other in the cache move as one copy), queued on a non-blocking
// stream of the store's own per CUDA context, and waited for before the put is issued or the
// get returns: as with Mooncake, the caller makes sure the GPU has finished writing a buffer
// before it is put (e.g. an event synchronized), and may use a get's destination as soon as
// the call returns. A call moves its keys in windows of at most Options::window_bytes of
// device parts (one key larger than that goes alone), so a large batch needs no more pinned
// memory than that; pinned buffers are reused across calls.
//
// Thread-safe: calls may run concurrently (each takes its own pinned buffer).

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "engine_plugin/cuda_driver.h"
#include "kvpool/client.h"

namespace kvpool::engine {

// Where a buffer lives.
struct MemoryPlace {
  // Null: memory the CPU reads and writes (pageable, pinned or managed). Otherwise the CUDA
  // context of the device memory the buffer lies in.
  void* device_context = nullptr;
  bool on_device() const { return device_context != nullptr; }
};

class DeviceStaging {
 public:
  struct Options {
    // Device bytes staged per window of a call (and so the pinned memory a call holds). Each
    // window is one put or get of the client, whose round trips cost a millisecond or two, so
    // a call's keys go in as few windows as this allows (docs/benchmarks.md).
    uint64_t window_bytes = uint64_t{128} << 20;
    // Pinned buffers kept for reuse between calls (the largest ones).
    size_t kept_buffers = 2;
  };

  // Finds the driver in this process (CudaDriver::LoadIfPresent) the first time it is asked
  // for after CUDA was loaded.
  explicit DeviceStaging(Options options);
  // With this driver table (tests: fakes).
  DeviceStaging(Options options, const CudaDriver& driver);
  ~DeviceStaging();
  DeviceStaging(const DeviceStaging&) = delete;
  DeviceStaging& operator=(const DeviceStaging&) = delete;

  // The driver, or null while this process has not loaded CUDA (then there is no device
  // memory: every buffer is host memory). Cheap once found.
  const CudaDriver* driver() ABSL_LOCKS_EXCLUDED(mu_);

  // Where [ptr, ptr + bytes) lives. InvalidArgument for a range that starts in device memory
  // and runs past the end of its allocation.
  absl::StatusOr<MemoryPlace> Locate(uint64_t ptr, uint64_t bytes) ABSL_LOCKS_EXCLUDED(mu_);

  // `places` holds, in order, the place of every part of every item. Runs `put` on the items
  // (in windows, in order) with their device parts replaced by pinned copies; per item its
  // status (a failed copy fails the items of its window).
  using PutFn = absl::FunctionRef<std::vector<absl::Status>(absl::Span<const PutItem>)>;
  std::vector<absl::Status> Put(absl::Span<const PutItem> items,
                                absl::Span<const MemoryPlace> places, PutFn put)
      ABSL_LOCKS_EXCLUDED(mu_);

  // The same for gets: runs `get` with device parts replaced by pinned buffers, then copies
  // each key's bytes read into its device parts; per item the bytes read, or why not (a copy
  // that failed fails the keys it was for: their device parts are not to be used).
  using GetFn = absl::FunctionRef<std::vector<absl::StatusOr<uint64_t>>(absl::Span<const GetItem>)>;
  std::vector<absl::StatusOr<uint64_t>> Get(absl::Span<const GetItem> items,
                                            absl::Span<const MemoryPlace> places, GetFn get)
      ABSL_LOCKS_EXCLUDED(mu_);

  // One range between host memory and memory at `place` (a plain memcpy for host memory).
  absl::Status CopyOut(void* dst, uint64_t src, size_t bytes, MemoryPlace place)
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status CopyIn(uint64_t dst, const void* src, size_t bytes, MemoryPlace place)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Device-to-host or host-to-device copies the last calls queued, after merging (tests).
  uint64_t copies_queued() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Pinned {
    uint8_t* data = nullptr;
    size_t bytes = 0;
    void* context = nullptr;  // the one current when it was allocated (to free it)
  };
  // One device range and its host side.
  struct Copy {
    uint64_t device = 0;
    uint8_t* host = nullptr;
    size_t bytes = 0;
    void* context = nullptr;
  };
  struct Window {
    size_t begin = 0, end = 0;  // items
    size_t first_place = 0;     // index in `places` of item `begin`'s first part
    uint64_t device_bytes = 0;
  };
  template <typename Item>
  std::vector<Window> Windows(absl::Span<const Item> items,
                              absl::Span<const MemoryPlace> places) const;
  // Which part of which item a copy is for, and where that part starts in the item's value.
  struct PartOf {
    size_t item = 0;
    size_t part = 0;
    uint64_t offset = 0;
  };
  // A window's items with their device parts replaced by ranges of a pinned buffer.
  template <typename Item>
  struct Staged {
    std::vector<Item> items;
    std::vector<Copy> copies;   // one per device part
    std::vector<PartOf> where;  // of each copy
    Pinned pinned;
  };
  template <typename Item>
  absl::StatusOr<Staged<Item>> Stage(absl::Span<const Item> window,
                                     absl::Span<const MemoryPlace> places, uint64_t device_bytes)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Gives each copy its host range in `pinned`, in device address order (so that neighbours
  // in device memory are neighbours there too).
  static void LayOut(std::vector<Copy>& copies, uint8_t* pinned);
  // Merges neighbours, queues every copy in `to_host` direction, waits for all of them.
  absl::Status Run(std::vector<Copy> copies, bool to_host) ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<CudaDriver::Stream> StreamLocked(void* context) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<Pinned> Acquire(size_t bytes, void* context) ABSL_LOCKS_EXCLUDED(mu_);
  void Release(Pinned pinned) ABSL_LOCKS_EXCLUDED(mu_);
  void FreeLocked(const Pinned& pinned) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options options_;
  const bool look_up_driver_;  // false: driver_ was given
  mutable absl::Mutex mu_;
  std::optional<CudaDriver> driver_ ABSL_GUARDED_BY(mu_);
  // Set once driver_ is; read without the lock after that.
  std::atomic<const CudaDriver*> found_{nullptr};
  // CudaDriver::LoadedObjects() at the last lookup that found no driver (0: none yet).
  std::atomic<uint64_t> looked_up_at_{0};
  absl::flat_hash_map<void*, CudaDriver::Stream> streams_ ABSL_GUARDED_BY(mu_);  // per context
  std::vector<Pinned> free_ ABSL_GUARDED_BY(mu_);
  uint64_t copies_queued_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace kvpool::engine
