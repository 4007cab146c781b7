#include "engine_plugin/device_staging.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace kvpool::engine {
namespace {

// Pinned allocations are rounded up to this (reuse across calls of slightly different sizes).
constexpr size_t kPinnedGranule = size_t{2} << 20;

absl::Status CudaError(const CudaDriver& driver, const char* call, CudaDriver::Result result) {
  return absl::InternalError(driver.Describe(call, result));
}

// Makes `context` current on this thread for the scope (the driver's calls act on the
// current context), restoring the previous one after.
class ScopedContext {
 public:
  ScopedContext(const CudaDriver& driver, void* context) : driver_(driver) {
    result_ = driver_.CtxPushCurrent(context);
  }
  ~ScopedContext() {
    if (result_ == 0) {
      CudaDriver::Context popped = nullptr;
      driver_.CtxPopCurrent(&popped);
    }
  }
  ScopedContext(const ScopedContext&) = delete;
  ScopedContext& operator=(const ScopedContext&) = delete;
  absl::Status status() const {
    return result_ == 0 ? absl::OkStatus() : CudaError(driver_, "cuCtxPushCurrent", result_);
  }

 private:
  const CudaDriver& driver_;
  CudaDriver::Result result_;
};

template <typename Part>
uint64_t Address(const Part& part) {
  return reinterpret_cast<uint64_t>(part.data);
}

}  // namespace

DeviceStaging::DeviceStaging(Options options) : options_(options), look_up_driver_(true) {}

DeviceStaging::DeviceStaging(Options options, const CudaDriver& driver)
    : options_(options), look_up_driver_(false), driver_(driver) {
  found_.store(&*driver_, std::memory_order_release);
}

DeviceStaging::~DeviceStaging() {
  absl::MutexLock lock(&mu_);
  if (!driver_.has_value()) return;
  for (const Pinned& pinned : free_) FreeLocked(pinned);
  for (auto [context, stream] : streams_) {
    ScopedContext current(*driver_, context);
    if (current.status().ok()) driver_->StreamDestroy(stream);
  }
}

const CudaDriver* DeviceStaging::driver() {
  if (const CudaDriver* found = found_.load(std::memory_order_acquire)) return found;
  if (!look_up_driver_) return nullptr;
  // The driver cannot have appeared unless something was loaded since the last lookup.
  uint64_t loaded = CudaDriver::LoadedObjects();
  if (loaded == looked_up_at_.load(std::memory_order_relaxed)) return nullptr;
  absl::MutexLock lock(&mu_);
  if (!driver_.has_value()) {
    driver_ = CudaDriver::LoadIfPresent();
    if (!driver_.has_value()) {
      looked_up_at_.store(loaded, std::memory_order_relaxed);
      return nullptr;
    }
    found_.store(&*driver_, std::memory_order_release);
  }
  return &*driver_;
}

absl::StatusOr<MemoryPlace> DeviceStaging::Locate(uint64_t ptr, uint64_t bytes) {
  const CudaDriver* d = driver();
  if (d == nullptr) return MemoryPlace{};
  unsigned memory_type = 0;
  int managed = 0;
  void* context = nullptr;
  uint64_t range_start = 0;
  size_t range_size = 0;
  int attributes[] = {CudaDriver::kAttributeMemoryType, CudaDriver::kAttributeIsManaged,
                      CudaDriver::kAttributeContext, CudaDriver::kAttributeRangeStart,
                      CudaDriver::kAttributeRangeSize};
  void* data[] = {&memory_type, &managed, &context, &range_start, &range_size};
  // Not an error for memory CUDA does not know (attributes stay zero); an error only where the
  // driver is not initialized, and then no device memory exists either.
  if (d->PointerGetAttributes(5, attributes, data, ptr) != 0) return MemoryPlace{};
  if (memory_type != CudaDriver::kMemoryTypeDevice || managed != 0) return MemoryPlace{};
  if (context == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("device memory at 0x", absl::Hex(ptr), " has no CUDA context"));
  }
  if (ptr < range_start || bytes > range_start + range_size - ptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "[0x", absl::Hex(ptr), ", +", bytes, ") runs past the end of its device allocation [0x",
        absl::Hex(range_start), ", +", range_size, ")"));
  }
  return MemoryPlace{.device_context = context};
}

template <typename Item>
std::vector<DeviceStaging::Window> DeviceStaging::Windows(
    absl::Span<const Item> items, absl::Span<const MemoryPlace> places) const {
  std::vector<Window> windows;
  Window current;
  size_t place = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    uint64_t device_bytes = 0;
    size_t first = place;
    for (const auto& part : items[i].parts) {
      if (places[place++].on_device()) device_bytes += part.size;
    }
    if (current.end > current.begin &&
        current.device_bytes + device_bytes > options_.window_bytes) {
      windows.push_back(current);
      current = Window{.begin = i, .end = i, .first_place = first};
    }
    current.end = i + 1;
    current.device_bytes += device_bytes;
  }
  if (current.end > current.begin) windows.push_back(current);
  return windows;
}

void DeviceStaging::LayOut(std::vector<Copy>& copies, uint8_t* pinned) {
  std::vector<Copy*> order;
  order.reserve(copies.size());
  for (Copy& c : copies) order.push_back(&c);
  std::sort(order.begin(), order.end(), [](const Copy* a, const Copy* b) {
    return std::tie(a->context, a->device) < std::tie(b->context, b->device);
  });
  size_t offset = 0;
  for (Copy* c : order) {
    c->host = pinned + offset;
    offset += c->bytes;
  }
}

absl::Status DeviceStaging::Run(std::vector<Copy> copies, bool to_host) {
  if (copies.empty()) return absl::OkStatus();
  const CudaDriver* d = driver();
  if (d == nullptr) return absl::FailedPreconditionError("device memory but no CUDA driver");
  std::sort(copies.begin(), copies.end(), [](const Copy& a, const Copy& b) {
    return std::tie(a.context, a.device) < std::tie(b.context, b.device);
  });
  // Neighbours on both sides become one copy.
  std::vector<Copy> merged;
  for (const Copy& c : copies) {
    if (c.bytes == 0) continue;
    if (!merged.empty()) {
      Copy& last = merged.back();
      if (last.context == c.context && last.device + last.bytes == c.device &&
          last.host + last.bytes == c.host) {
        last.bytes += c.bytes;
        continue;
      }
    }
    merged.push_back(c);
  }
  std::vector<std::pair<void*, CudaDriver::Stream>> used;
  absl::Status status;
  for (size_t i = 0; i < merged.size() && status.ok();) {
    void* context = merged[i].context;
    ScopedContext current(*d, context);
    status = current.status();
    if (!status.ok()) break;
    absl::StatusOr<CudaDriver::Stream> stream;
    {
      absl::MutexLock lock(&mu_);
      stream = StreamLocked(context);
    }
    if (!stream.ok()) {
      status = stream.status();
      break;
    }
    used.emplace_back(context, *stream);
    for (; i < merged.size() && merged[i].context == context; ++i) {
      const Copy& c = merged[i];
      CudaDriver::Result r = to_host ? d->MemcpyDtoHAsync(c.host, c.device, c.bytes, *stream)
                                     : d->MemcpyHtoDAsync(c.device, c.host, c.bytes, *stream);
      if (r != 0) {
        status = CudaError(*d, to_host ? "cuMemcpyDtoHAsync" : "cuMemcpyHtoDAsync", r);
        break;
      }
    }
  }
  {
    absl::MutexLock lock(&mu_);
    copies_queued_ += merged.size();
  }
  // Whatever was queued is waited for, even after an error: the pinned buffer is reused.
  for (auto [context, stream] : used) {
    ScopedContext current(*d, context);
    if (!current.status().ok()) {
      status.Update(current.status());
      continue;
    }
    if (CudaDriver::Result r = d->StreamSynchronize(stream); r != 0) {
      status.Update(CudaError(*d, "cuStreamSynchronize", r));
    }
  }
  return status;
}

absl::StatusOr<CudaDriver::Stream> DeviceStaging::StreamLocked(void* context) {
  auto it = streams_.find(context);
  if (it != streams_.end()) return it->second;
  CudaDriver::Stream stream = nullptr;
  if (CudaDriver::Result r = driver_->StreamCreate(&stream, CudaDriver::kStreamNonBlocking);
      r != 0) {
    return CudaError(*driver_, "cuStreamCreate", r);
  }
  streams_.emplace(context, stream);
  return stream;
}

absl::StatusOr<DeviceStaging::Pinned> DeviceStaging::Acquire(size_t bytes, void* context) {
  absl::MutexLock lock(&mu_);
  // The smallest free buffer that fits.
  auto best = free_.end();
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->bytes >= bytes && (best == free_.end() || it->bytes < best->bytes)) best = it;
  }
  if (best != free_.end()) {
    Pinned pinned = *best;
    free_.erase(best);
    return pinned;
  }
  Pinned pinned{.bytes = (bytes + kPinnedGranule - 1) / kPinnedGranule * kPinnedGranule,
                .context = context};
  ScopedContext current(*driver_, context);
  if (!current.status().ok()) return current.status();
  void* data = nullptr;
  if (CudaDriver::Result r =
          driver_->MemHostAlloc(&data, pinned.bytes, CudaDriver::kHostAllocPortable);
      r != 0) {
    return CudaError(*driver_, "cuMemHostAlloc", r);
  }
  pinned.data = static_cast<uint8_t*>(data);
  return pinned;
}

void DeviceStaging::Release(Pinned pinned) {
  absl::MutexLock lock(&mu_);
  free_.push_back(pinned);
  if (free_.size() <= options_.kept_buffers) return;
  // Keep the largest ones.
  auto smallest =
      std::min_element(free_.begin(), free_.end(),
                       [](const Pinned& a, const Pinned& b) { return a.bytes < b.bytes; });
  FreeLocked(*smallest);
  free_.erase(smallest);
}

void DeviceStaging::FreeLocked(const Pinned& pinned) {
  ScopedContext current(*driver_, pinned.context);
  if (current.status().ok()) driver_->MemFreeHost(pinned.data);
}

template <typename Item>
absl::StatusOr<DeviceStaging::Staged<Item>> DeviceStaging::Stage(
    absl::Span<const Item> window, absl::Span<const MemoryPlace> places, uint64_t device_bytes) {
  Staged<Item> staged;
  staged.items.assign(window.begin(), window.end());
  size_t place = 0;
  void* first_context = nullptr;
  for (size_t i = 0; i < staged.items.size(); ++i) {
    uint64_t offset = 0;
    for (size_t j = 0; j < staged.items[i].parts.size(); ++j, ++place) {
      uint64_t size = staged.items[i].parts[j].size;
      offset += size;
      if (!places[place].on_device()) continue;
      if (first_context == nullptr) first_context = places[place].device_context;
      staged.copies.push_back(Copy{.device = Address(staged.items[i].parts[j]),
                                   .bytes = size,
                                   .context = places[place].device_context});
      staged.where.push_back({.item = i, .part = j, .offset = offset - size});
    }
  }
  absl::StatusOr<Pinned> pinned = Acquire(device_bytes, first_context);
  if (!pinned.ok()) return pinned.status();
  staged.pinned = *pinned;
  LayOut(staged.copies, staged.pinned.data);
  for (size_t k = 0; k < staged.copies.size(); ++k) {
    staged.items[staged.where[k].item].parts[staged.where[k].part].data = staged.copies[k].host;
  }
  return staged;
}

std::vector<absl::Status> DeviceStaging::Put(absl::Span<const PutItem> items,
                                             absl::Span<const MemoryPlace> places, PutFn put) {
  std::vector<absl::Status> out;
  out.reserve(items.size());
  for (const Window& w : Windows(items, places)) {
    absl::Span<const PutItem> window = items.subspan(w.begin, w.end - w.begin);
    if (w.device_bytes == 0) {
      for (absl::Status& s : put(window)) out.push_back(std::move(s));
      continue;
    }
    absl::StatusOr<Staged<PutItem>> staged =
        Stage(window, places.subspan(w.first_place), w.device_bytes);
    if (!staged.ok()) {
      out.insert(out.end(), window.size(), staged.status());
      continue;
    }
    absl::Status copied = Run(staged->copies, /*to_host=*/true);
    if (copied.ok()) {
      for (absl::Status& s : put(staged->items)) out.push_back(std::move(s));
    } else {
      out.insert(out.end(), window.size(), copied);
    }
    Release(staged->pinned);
  }
  return out;
}

std::vector<absl::StatusOr<uint64_t>> DeviceStaging::Get(absl::Span<const GetItem> items,
                                                         absl::Span<const MemoryPlace> places,
                                                         GetFn get) {
  std::vector<absl::StatusOr<uint64_t>> out;
  out.reserve(items.size());
  for (const Window& w : Windows(items, places)) {
    absl::Span<const GetItem> window = items.subspan(w.begin, w.end - w.begin);
    if (w.device_bytes == 0) {
      for (absl::StatusOr<uint64_t>& r : get(window)) out.push_back(std::move(r));
      continue;
    }
    absl::StatusOr<Staged<GetItem>> staged =
        Stage(window, places.subspan(w.first_place), w.device_bytes);
    if (!staged.ok()) {
      out.insert(out.end(), window.size(), staged.status());
      continue;
    }
    std::vector<absl::StatusOr<uint64_t>> results = get(staged->items);
    // Each key's bytes read, in part order, into its device parts.
    std::vector<Copy> back;
    std::vector<bool> copied_into(window.size(), false);
    for (size_t k = 0; k < staged->copies.size(); ++k) {
      size_t i = staged->where[k].item;
      if (!results[i].ok()) continue;
      uint64_t read = *results[i];
      uint64_t before = staged->where[k].offset;
      if (read <= before) continue;
      Copy c = staged->copies[k];
      c.bytes = std::min<uint64_t>(c.bytes, read - before);
      back.push_back(c);
      copied_into[i] = true;
    }
    absl::Status copied = Run(std::move(back), /*to_host=*/false);
    Release(staged->pinned);
    for (size_t i = 0; i < window.size(); ++i) {
      if (!copied.ok() && copied_into[i]) {
        out.push_back(copied);
      } else {
        out.push_back(std::move(results[i]));
      }
    }
  }
  return out;
}

absl::Status DeviceStaging::CopyOut(void* dst, uint64_t src, size_t bytes, MemoryPlace place) {
  if (!place.on_device()) {
    std::memcpy(dst, reinterpret_cast<const void*>(src), bytes);
    return absl::OkStatus();
  }
  return Run({Copy{.device = src,
                   .host = static_cast<uint8_t*>(dst),
                   .bytes = bytes,
                   .context = place.device_context}},
             /*to_host=*/true);
}

absl::Status DeviceStaging::CopyIn(uint64_t dst, const void* src, size_t bytes, MemoryPlace place) {
  if (!place.on_device()) {
    std::memcpy(reinterpret_cast<void*>(dst), src, bytes);
    return absl::OkStatus();
  }
  return Run({Copy{.device = dst,
                   .host = static_cast<uint8_t*>(const_cast<void*>(src)),
                   .bytes = bytes,
                   .context = place.device_context}},
             /*to_host=*/false);
}

uint64_t DeviceStaging::copies_queued() const {
  absl::MutexLock lock(&mu_);
  return copies_queued_;
}

}  // namespace kvpool::engine
