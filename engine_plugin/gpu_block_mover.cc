#include "engine_plugin/gpu_block_mover.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <future>

#include "absl/strings/str_cat.h"
#include "kernels/block_copy.cuh"
#include "kernels/checksum.cuh"
#include "proto/error_codes.h"

namespace kvpool::engine {
namespace {

absl::Status CudaError(absl::string_view what, cudaError_t error) {
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorString(error)));
}

}  // namespace

absl::StatusOr<std::unique_ptr<GpuBlockMover>> GpuBlockMover::Create(Client& client,
                                                                     const KvCacheLayout& layout,
                                                                     cudaStream_t stream) {
  return Create(client, layout,
                GpuBlockMoverOptions{.store_stream = stream, .load_stream = stream});
}

absl::StatusOr<std::unique_ptr<GpuBlockMover>> GpuBlockMover::Create(
    Client& client, const KvCacheLayout& layout, GpuBlockMoverOptions options) {
  // Layouts of more segments than the checksum kernel takes are hashed by the CPU at commit.
  const bool gpu_checksums =
      options.gpu_checksums && layout.segments().size() <= size_t{kernels::kMaxChecksumSegments};
  std::unique_ptr<GpuBlockMover> mover(
      new GpuBlockMover(client, options, gpu_checksums));
  mover->layerwise_tail_ = std::clamp(options.layerwise_tail, 0.0, 1.0);
  mover->layerwise_tail_max_bytes_ = options.layerwise_tail_max_bytes;
  if (cudaError_t e = cudaGetDevice(&mover->device_); e != cudaSuccess) {
    return CudaError("finding the current device", e);
  }
  for (const KvSegment& segment : layout.segments()) {
    mover->segments_.push_back(kernels::KvSegment{segment.base, segment.block_bytes,
                                                  segment.block_bytes, mover->bytes_per_block_});
    mover->bytes_per_block_ += segment.block_bytes;
  }
  if (mover->bytes_per_block_ == 0) return absl::InvalidArgumentError("the layout has no bytes");
  // Layers (the layout's tensors) and the groups of consecutive layers a layer-wise load copies
  // at once: at least layerwise_group_bytes of each block per group.
  const std::vector<int>& tensors = layout.segment_tensors();
  uint64_t group_bytes = 0;
  for (size_t s = 0; s < mover->segments_.size(); ++s) {
    const int tensor = s < tensors.size() ? tensors[s] : static_cast<int>(s);
    const bool new_layer = s == 0 || s - 1 >= tensors.size() || tensors[s - 1] != tensor;
    if (new_layer && (s == 0 || group_bytes >= options.layerwise_group_bytes)) {
      mover->layers_.emplace_back(static_cast<int>(s), 0);
      group_bytes = 0;
    }
    if (new_layer) mover->group_of_layer_.push_back(static_cast<int>(mover->layers_.size()) - 1);
    ++mover->layers_.back().second;
    group_bytes += mover->segments_[s].block_bytes;
  }
  for (size_t l = 0; l <= mover->layers_.size(); ++l) {
    cudaEvent_t event = nullptr;
    if (cudaError_t e = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
        e != cudaSuccess) {
      return CudaError("creating a layer's event", e);
    }
    if (l < mover->layers_.size()) {
      mover->layer_events_.push_back(event);
    } else {
      mover->layerwise_done_ = event;
    }
  }
  const uint64_t pinned = std::max(options.pinned_staging_bytes, mover->bytes_per_block_);
  // A store's first batch is staged whole (StoreBlocks), up to 256 MiB of it.
  const uint64_t store_pinned = std::max<uint64_t>(
      pinned, std::min<uint64_t>(options.staged_first_batch_blocks * mover->bytes_per_block_,
                                 uint64_t{256} << 20));
  if (absl::Status s = mover->SetUp(mover->store_, options.store_stream, store_pinned); !s.ok()) {
    return s;
  }
  if (absl::Status s = mover->SetUp(mover->load_, options.load_stream, pinned); !s.ok()) return s;
  client.MapLocalPools();
  if (absl::Status registered = mover->RegisterNewPools(); !registered.ok()) return registered;
  return mover;
}

absl::Status GpuBlockMover::SetUp(Direction& direction, cudaStream_t stream,
                                  uint64_t pinned_bytes) {
  absl::MutexLock lock(&direction.mu);
  if (stream == nullptr) {
    if (cudaError_t e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking); e != cudaSuccess) {
      return CudaError("creating a copy stream", e);
    }
    direction.own_stream = true;
  }
  direction.stream = stream;
  if (cudaError_t e = cudaStreamCreateWithFlags(&direction.sum_stream, cudaStreamNonBlocking);
      e != cudaSuccess) {
    return CudaError("creating a checksum stream", e);
  }
  // Room to stage a few whole block objects in device memory (CopyMethod::kStaged).
  direction.staging.bytes = std::max<uint64_t>(bytes_per_block_ * 8, uint64_t{64} << 20);
  if (cudaError_t e = cudaMalloc(&direction.staging.device, direction.staging.bytes);
      e != cudaSuccess) {
    return CudaError("allocating the copy staging buffer", e);
  }
  direction.pinned_bytes = pinned_bytes;
  if (cudaError_t e = cudaHostAlloc(reinterpret_cast<void**>(&direction.pinned), pinned_bytes,
                                    cudaHostAllocDefault);
      e != cudaSuccess) {
    return CudaError("allocating the pinned staging buffer", e);
  }
  return ReserveSums(direction.sums, direction.sums_capacity, 2 * batch_);
}

absl::Status GpuBlockMover::ReserveSums(uint64_t*& sums, size_t& capacity, size_t n) {
  if (n <= capacity) return absl::OkStatus();
  const size_t grown = std::max(n, 2 * capacity);
  if (sums != nullptr) cudaFreeHost(sums);
  sums = nullptr;
  capacity = 0;
  if (cudaError_t e = cudaHostAlloc(reinterpret_cast<void**>(&sums), grown * sizeof(uint64_t),
                                    cudaHostAllocDefault);
      e != cudaSuccess) {
    sums = nullptr;
    return CudaError("allocating the checksums' buffer", e);
  }
  capacity = grown;
  return absl::OkStatus();
}

absl::Status GpuBlockMover::LaunchChecksums(Direction& direction, const Batch& batch,
                                            bool after_copy) {
  if (batch.ids.empty() || batch.sums == nullptr) return absl::OkStatus();
  cudaError_t e = after_copy ? cudaStreamWaitEvent(direction.sum_stream, batch.done, 0)
                             : cudaSuccess;
  if (e == cudaSuccess) {
    e = kernels::ChecksumBlocks(segments_.data(), static_cast<int>(segments_.size()),
                                batch.ids.data(), static_cast<int>(batch.ids.size()), batch.sums,
                                direction.sum_stream);
  }
  if (e == cudaSuccess) e = cudaEventRecord(batch.summed, direction.sum_stream);
  return e == cudaSuccess ? absl::OkStatus() : CudaError("checksumming blocks", e);
}

void GpuBlockMover::CopyIntoPool(const Batch& batch) {
  // A few threads (the head is 128 MiB by default, a core copies a few GB/s): this batch's
  // commit should be done long before the last batch's copy ends.
  constexpr size_t kParts = 4;
  std::vector<std::function<void()>> parts;
  for (size_t part = 0; part < kParts; ++part) {
    parts.push_back([this, &batch, part] {
      for (size_t k = part; k < batch.head_slot.size(); k += kParts) {
        std::memcpy(batch.objects[k], store_.pinned + batch.head_slot[k] * bytes_per_block_,
                    bytes_per_block_);
      }
    });
  }
  round_trips_.Run(std::move(parts));
}

GpuBlockMover::~GpuBlockMover() {
  for (Direction* direction : {&store_, &load_}) {
    absl::MutexLock lock(&direction->mu);
    if (direction->stream != nullptr) cudaStreamSynchronize(direction->stream);
    if (direction->sum_stream != nullptr) {
      cudaStreamSynchronize(direction->sum_stream);
      cudaStreamDestroy(direction->sum_stream);
    }
    if (direction->staging.device != nullptr) cudaFree(direction->staging.device);
    if (direction->pinned != nullptr) cudaFreeHost(direction->pinned);
    if (direction->sums != nullptr) cudaFreeHost(direction->sums);
    if (direction->own_stream) cudaStreamDestroy(direction->stream);
  }
  {
    absl::MutexLock lock(&load_.mu);
    if (layerwise_sums_ != nullptr) cudaFreeHost(layerwise_sums_);
  }
  for (cudaEvent_t event : layer_events_) cudaEventDestroy(event);
  if (layerwise_done_ != nullptr) cudaEventDestroy(layerwise_done_);
  absl::MutexLock lock(&pools_mu_);
  for (uint8_t* base : owned_registrations_) cudaHostUnregister(base);
}

absl::Status GpuBlockMover::RegisterNewPools() {
  std::vector<MappedPool> pools = client_.MappedPools();
  absl::MutexLock lock(&pools_mu_);
  for (const MappedPool& pool : pools) {
    if (registered_.contains(pool.base)) continue;
    cudaError_t e = cudaHostRegister(pool.base, pool.size, cudaHostRegisterDefault);
    if (e == cudaSuccess) {
      owned_registrations_.push_back(pool.base);
    } else if (e == cudaErrorHostMemoryAlreadyRegistered) {
      cudaGetLastError();  // registered by another mover of this process: used, not owned
    } else {
      return CudaError(absl::StrCat("registering the pool of ", pool.endpoint), e);
    }
    registered_.insert(pool.base);
  }
  return absl::OkStatus();
}

absl::Status GpuBlockMover::Launch(Direction& direction, const Batch& batch,
                                   kernels::CopyDirection how) {
  if (batch.ids.empty()) return absl::OkStatus();
  cudaError_t e = kernels::CopyBlocks(
      segments_.data(), static_cast<int>(segments_.size()), batch.ids.data(),
      batch.objects.data(), static_cast<int>(batch.ids.size()), how,
      kernels::AutoCopyMethod(bytes_per_block_, /*have_staging=*/true), direction.staging,
      direction.stream);
  if (e == cudaSuccess) e = cudaEventRecord(batch.done, direction.stream);
  return e == cudaSuccess ? absl::OkStatus() : CudaError("copying blocks", e);
}

GpuBlockMover::Batch::Batch() {
  cudaEventCreateWithFlags(&done, cudaEventDisableTiming);
  cudaEventCreateWithFlags(&summed, cudaEventDisableTiming);
}
GpuBlockMover::Batch::~Batch() {
  cudaEventDestroy(done);
  cudaEventDestroy(summed);
}

MoverPhaseTimes GpuBlockMover::store_times() {
  absl::MutexLock lock(&store_.mu);
  return store_.times;
}

MoverPhaseTimes GpuBlockMover::load_times() {
  absl::MutexLock lock(&load_.mu);
  return load_.times;
}

namespace {
// Adds the time since the last call (or construction) to a phase.
class PhaseClock {
 public:
  PhaseClock() : last_(absl::Now()), start_(last_) {}
  void Charge(absl::Duration& phase) {
    const absl::Time now = absl::Now();
    phase += now - last_;
    last_ = now;
  }
  absl::Duration Total() const { return absl::Now() - start_; }
  absl::Time start() const { return start_; }

 private:
  absl::Time last_;
  absl::Time start_;
};
}  // namespace

std::vector<absl::Status> GpuBlockMover::StoreBlocks(absl::Span<const std::string> keys,
                                                     absl::Span<const int32_t> block_ids) {
  absl::MutexLock lock(&store_.mu);
  PhaseClock clock;
  MoverPhaseTimes& times = store_.times;
  std::vector<absl::Status> results(keys.size());
  if (cudaError_t e = cudaSetDevice(device_); e != cudaSuccess) {
    results.assign(keys.size(), CudaError("selecting the cache's device", e));
    return results;
  }
  std::vector<size_t> remote;  // keys for the network path
  const bool gpu_sums = gpu_checksums_ && !force_remote_;
  if (gpu_sums) {
    if (absl::Status room = ReserveSums(store_.sums, store_.sums_capacity, keys.size());
        !room.ok()) {
      results.assign(keys.size(), room);
      return results;
    }
  }
  // Every batch's reservation is asked for at once (the master answers them side by side),
  // each batch's copy queued on the GPU as soon as its space is known, and each batch
  // committed (after its copy) on a thread of round_trips_, so that round trips overlap the
  // copies and each other. The head (the first batch) does not wait for its space: the GPU
  // copies it into the pinned buffer now, and its commit task copies it into the pool. What
  // remains in sight is the last commit.
  // (As many of staged_first_batch_ as the pinned buffer holds: it caps at 256 MiB.)
  const size_t head_blocks =
      std::min<size_t>(staged_first_batch_, store_.pinned_bytes / bytes_per_block_);
  const bool staging = head_blocks > 0 && !force_remote_;
  const std::vector<std::pair<size_t, size_t>> spans =
      Batches(keys.size(), staging ? head_blocks : first_batch_);
  std::unique_ptr<Batch> head;
  if (staging && !spans.empty()) {
    head = std::make_unique<Batch>();
    for (size_t i = 0; i < spans[0].second; ++i) {
      head->ids.push_back(block_ids[i]);
      head->objects.push_back(store_.pinned + i * bytes_per_block_);
    }
    if (gpu_sums) head->sums = store_.sums;
    absl::Status launched = Launch(store_, *head, kernels::CopyDirection::kDeviceToHost);
    if (launched.ok()) launched = LaunchChecksums(store_, *head, /*after_copy=*/false);
    if (launched.ok()) {
      times.to_first_copy += absl::Now() - clock.start();
    } else {
      head.reset();  // the head goes the way of the other batches (and meets the error there)
    }
  }
  std::vector<std::future<std::vector<absl::StatusOr<LocalReservation>>>> reserving;
  if (!force_remote_) {
    for (const auto& [first, n] : spans) {
      std::vector<uint64_t> sizes(n, bytes_per_block_);
      reserving.push_back(
          round_trips_.Async([this, k = keys.subspan(first, n), sizes = std::move(sizes)] {
            return client_.BatchReserveLocal(k, sizes);
          }));
    }
  }
  // Waits for the batch's copy (the head's: then copies it into the pool), then commits it
  // with the checksums the GPU computed.
  auto commit = [this, &results](Batch& batch) {
    cudaError_t e = cudaEventSynchronize(batch.done);
    if (e == cudaSuccess && batch.sums != nullptr) e = cudaEventSynchronize(batch.summed);
    if (e == cudaSuccess && !batch.head_slot.empty()) CopyIntoPool(batch);
    batch.copied = absl::Now();
    if (e != cudaSuccess) {
      client_.BatchAbandonLocal(batch.reservations);
      for (size_t owner : batch.owners) results[owner] = CudaError("copying blocks", e);
      return;
    }
    if (batch.sums != nullptr) {
      for (size_t k = 0; k < batch.reservations.size(); ++k) {
        batch.reservations[k].checksum =
            batch.sums[batch.head_slot.empty() ? k : batch.head_slot[k]];
      }
    }
    std::vector<absl::Status> committed = client_.BatchCommitLocal(batch.reservations);
    for (size_t k = 0; k < batch.owners.size(); ++k) results[batch.owners[k]] = committed[k];
  };
  std::vector<std::unique_ptr<Batch>> batches;
  std::vector<std::future<void>> committing;
  for (size_t b = 0; b < reserving.size(); ++b) {
    const auto [first, n] = spans[b];
    clock.Charge(times.launch);
    std::vector<absl::StatusOr<LocalReservation>> reserved = reserving[b].get();
    clock.Charge(times.master);
    absl::Status registered = RegisterNewPools();
    const bool staged = b == 0 && head != nullptr;
    std::unique_ptr<Batch> batch = staged ? std::move(head) : std::make_unique<Batch>();
    if (staged) {
      batch->ids.clear();
      batch->objects.clear();
    } else if (gpu_sums) {
      batch->sums = store_.sums + first;
    }
    for (size_t i = 0; i < n; ++i) {
      if (!reserved[i].ok()) {
        // Already in the pool counts as stored (dedup); space only on another machine goes
        // over the network.
        int code = ToErrorCode(reserved[i].status());
        if (code == v1::OBJECT_ALREADY_EXISTS) {
          results[first + i] = absl::OkStatus();
        } else if (absl::IsFailedPrecondition(reserved[i].status())) {
          remote.push_back(first + i);
        } else {
          results[first + i] = reserved[i].status();
        }
        continue;
      }
      batch->reservations.push_back(*reserved[i]);
      batch->ids.push_back(block_ids[first + i]);
      batch->objects.push_back(reserved[i]->data);
      batch->owners.push_back(first + i);
      if (staged) batch->head_slot.push_back(static_cast<uint32_t>(i));
    }
    if (staged && batch->ids.empty()) {
      // Nothing of the head to write (all stored already, or elsewhere): its copy into the
      // pinned buffer and its checksums may still run; they end before the buffers are reused.
      cudaEventSynchronize(batch->done);
      if (batch->sums != nullptr) cudaEventSynchronize(batch->summed);
      continue;
    }
    // Step P2 for a GPU cache: the GPU hashes each block where it is and writes it straight
    // into its reserved space (the head is in the pinned buffer already).
    absl::Status launched = absl::OkStatus();
    if (!staged) {
      launched = registered.ok() ? Launch(store_, *batch, kernels::CopyDirection::kDeviceToHost)
                                 : registered;
      if (launched.ok()) launched = LaunchChecksums(store_, *batch, /*after_copy=*/false);
    }
    if (!launched.ok()) {
      client_.BatchAbandonLocal(batch->reservations);
      for (size_t owner : batch->owners) results[owner] = launched;
      continue;
    }
    if (batch->ids.empty()) continue;
    if (batches.empty() && !staged) times.to_first_copy += absl::Now() - clock.start();
    committing.push_back(round_trips_.Async([&commit, &batch = *batch] { commit(batch); }));
    batches.push_back(std::move(batch));
  }
  clock.Charge(times.launch);
  for (std::future<void>& f : committing) f.get();
  clock.Charge(times.commit);
  if (!batches.empty()) {
    absl::Time last_copy = absl::InfinitePast();
    for (const std::unique_ptr<Batch>& batch : batches) last_copy = std::max(last_copy, batch->copied);
    times.after_last_copy += absl::Now() - last_copy;
  }
  if (force_remote_) {
    for (size_t i = 0; i < keys.size(); ++i) remote.push_back(i);
  }
  if (!remote.empty()) StoreRemote(keys, block_ids, remote, results);
  times.total += clock.Total();
  times.calls += 1;
  times.blocks += keys.size();
  return results;
}

void GpuBlockMover::StoreRemote(absl::Span<const std::string> keys,
                                absl::Span<const int32_t> block_ids,
                                absl::Span<const size_t> owners,
                                std::vector<absl::Status>& results) {
  const size_t per_round = std::max<size_t>(1, store_.pinned_bytes / bytes_per_block_);
  for (size_t first = 0; first < owners.size(); first += per_round) {
    const size_t n = std::min(per_round, owners.size() - first);
    Batch batch;
    std::vector<PutItem> items;
    for (size_t k = 0; k < n; ++k) {
      const size_t owner = owners[first + k];
      uint8_t* object = store_.pinned + k * bytes_per_block_;
      batch.ids.push_back(block_ids[owner]);
      batch.objects.push_back(object);
      items.push_back(PutItem{.key = keys[owner], .parts = {ConstBuffer{object, bytes_per_block_}}});
    }
    absl::Status copied = Launch(store_, batch, kernels::CopyDirection::kDeviceToHost);
    if (copied.ok()) {
      if (cudaError_t e = cudaEventSynchronize(batch.done); e != cudaSuccess) {
        copied = CudaError("copying blocks", e);
      }
    }
    std::vector<absl::Status> put;
    if (copied.ok()) put = client_.BatchPut(items);
    for (size_t k = 0; k < n; ++k) {
      absl::Status status = !copied.ok()       ? copied
                            : k < put.size()   ? put[k]
                                               : absl::InternalError("no result");
      results[owners[first + k]] = absl::IsAlreadyExists(status) ? absl::OkStatus() : status;
    }
  }
}

std::vector<absl::Status> GpuBlockMover::LoadBlocks(absl::Span<const std::string> keys,
                                                    absl::Span<const int32_t> block_ids) {
  absl::MutexLock lock(&load_.mu);
  PhaseClock clock;
  MoverPhaseTimes& times = load_.times;
  std::vector<absl::Status> results(keys.size());
  if (cudaError_t e = cudaSetDevice(device_); e != cudaSuccess) {
    results.assign(keys.size(), CudaError("selecting the cache's device", e));
    return results;
  }
  std::vector<size_t> remote;
  const bool gpu_sums = gpu_checksums_ && !force_remote_;
  if (gpu_sums) {
    if (absl::Status room = ReserveSums(load_.sums, load_.sums_capacity, keys.size());
        !room.ok()) {
      results.assign(keys.size(), room);
      return results;
    }
  }
  // Every batch is located at once (the master answers side by side), and each batch's copy
  // queued on the stream as soon as it is located; one wait at the end.
  std::vector<Located> locating = LocateBatches(keys, Batches(keys.size(), first_batch_));
  std::vector<std::unique_ptr<Batch>> launched;
  for (Located& batch_located : locating) {
    const size_t first = batch_located.first;
    const size_t n = batch_located.n;
    auto batch = std::make_unique<Batch>();
    clock.Charge(times.launch);
    std::vector<absl::StatusOr<LocalValue>> located = batch_located.values.get();
    batch->lease_expiry = batch_located.lease_expiry;
    clock.Charge(times.master);
    absl::Status registered = RegisterNewPools();
    for (size_t i = 0; i < n; ++i) {
      if (!located[i].ok()) {
        if (absl::IsFailedPrecondition(located[i].status())) {
          remote.push_back(first + i);  // no replica on a pool of this machine
        } else {
          results[first + i] = located[i].status();
        }
      } else if (located[i]->size != bytes_per_block_) {
        results[first + i] = absl::InvalidArgumentError(
            absl::StrCat("object has ", located[i]->size, " bytes, a block ", bytes_per_block_));
      } else {
        batch->ids.push_back(block_ids[first + i]);
        batch->objects.push_back(located[i]->data);
        batch->owners.push_back(first + i);
        batch->expected.push_back(located[i]->checksum);
      }
    }
    if (gpu_sums) batch->sums = load_.sums + first;
    // Step G2 for a GPU cache: the GPU reads each block straight from the pool, then hashes it
    // where it landed in the cache.
    absl::Status status = registered.ok()
                              ? Launch(load_, *batch, kernels::CopyDirection::kHostToDevice)
                              : registered;
    if (status.ok()) status = LaunchChecksums(load_, *batch, /*after_copy=*/true);
    if (!status.ok()) {
      for (size_t owner : batch->owners) results[owner] = status;
      continue;
    }
    if (launched.empty() && !batch->ids.empty()) {
      times.to_first_copy += absl::Now() - clock.start();
    }
    launched.push_back(std::move(batch));
  }
  clock.Charge(times.launch);
  cudaError_t e = cudaStreamSynchronize(load_.stream);
  if (e == cudaSuccess) e = cudaStreamSynchronize(load_.sum_stream);
  clock.Charge(times.wait);
  absl::Time finished = absl::Now();
  for (const std::unique_ptr<Batch>& batch : launched) {
    absl::Status status =
        e != cudaSuccess            ? CudaError("copying blocks", e)
        : finished > batch->lease_expiry
            ? ErrorStatus(v1::LEASE_EXPIRED, "the copy outlasted the lease; load again")
            : absl::OkStatus();
    for (size_t k = 0; k < batch->owners.size(); ++k) {
      results[batch->owners[k]] =
          status.ok() && batch->sums != nullptr && batch->expected[k] != 0 &&
                  batch->sums[k] != batch->expected[k]
              ? ErrorStatus(v1::CHECKSUM_MISMATCH,
                            "the block loaded does not match its writer's checksum; recompute it")
              : status;
    }
  }
  if (force_remote_) {
    for (size_t i = 0; i < keys.size(); ++i) remote.push_back(i);
  }
  if (!remote.empty()) LoadRemote(keys, block_ids, remote, results);
  times.total += clock.Total();
  times.calls += 1;
  times.blocks += keys.size();
  return results;
}

std::vector<std::pair<size_t, size_t>> GpuBlockMover::Batches(size_t count,
                                                              size_t first_batch) const {
  // The last batch's size first (when limited), then the others from the front.
  const size_t head = std::min(std::max<size_t>(1, first_batch), count);
  const size_t last = last_batch_ == 0 || count - head <= last_batch_ ? 0 : last_batch_;
  std::vector<std::pair<size_t, size_t>> spans;
  for (size_t first = 0, n = 0; first < count - last; first += n) {
    n = std::min(first == 0 ? head : batch_, count - last - first);
    spans.emplace_back(first, n);
  }
  if (last > 0) spans.emplace_back(count - last, last);
  return spans;
}

std::vector<GpuBlockMover::Located> GpuBlockMover::LocateBatches(
    absl::Span<const std::string> keys, const std::vector<std::pair<size_t, size_t>>& spans,
    bool kept) {
  std::vector<Located> located;
  if (force_remote_) return located;
  for (const auto& [first, n] : spans) located.push_back(Located{.first = first, .n = n});
  const absl::Time usable_until = absl::Now() + kLocatedMargin;
  for (Located& batch : located) {
    // The locations Locate kept for this batch's keys (each used once), the others asked for.
    std::vector<absl::StatusOr<LocalValue>> values(batch.n, absl::UnknownError("not located"));
    std::vector<size_t> ask;
    absl::Time expiry = absl::InfiniteFuture();
    {
      absl::MutexLock lock(&located_mu_);
      for (size_t i = 0; i < batch.n; ++i) {
        auto it = kept ? located_.find(keys[batch.first + i]) : located_.end();
        if (it != located_.end() && it->second.lease_expiry > usable_until) {
          values[i] = it->second.value;
          expiry = std::min(expiry, it->second.lease_expiry);
        } else {
          ask.push_back(i);
        }
        if (it != located_.end()) located_.erase(it);
      }
    }
    if (ask.empty()) {
      batch.lease_expiry = expiry;
      std::promise<std::vector<absl::StatusOr<LocalValue>>> ready;
      ready.set_value(std::move(values));
      batch.values = ready.get_future();
      continue;
    }
    batch.values = round_trips_.Async([this, k = keys.subspan(batch.first, batch.n), &batch, expiry,
                                       values = std::move(values), ask = std::move(ask)]() mutable {
      std::vector<std::string> asked;
      asked.reserve(ask.size());
      for (size_t i : ask) asked.push_back(k[i]);
      absl::Time asked_expiry = absl::InfiniteFuture();
      std::vector<absl::StatusOr<LocalValue>> answered =
          client_.BatchGetLocal(asked, &asked_expiry);
      for (size_t j = 0; j < ask.size(); ++j) values[ask[j]] = std::move(answered[j]);
      batch.lease_expiry = std::min(expiry, asked_expiry);
      return std::move(values);
    });
  }
  return located;
}

std::optional<std::vector<bool>> GpuBlockMover::Locate(absl::Span<const std::string> keys) {
  if (force_remote_) return std::nullopt;
  std::vector<Located> located =
      LocateBatches(keys, Batches(keys.size(), first_batch_), /*kept=*/false);
  std::vector<bool> present(keys.size(), false);
  for (Located& batch : located) {
    std::vector<absl::StatusOr<LocalValue>> values = batch.values.get();
    absl::MutexLock lock(&located_mu_);
    if (located_.size() + batch.n > kMaxLocated) {
      // Full (lookups whose loads never came): drop what is expired, else everything.
      absl::erase_if(located_, [now = absl::Now()](const auto& entry) {
        return entry.second.lease_expiry <= now;
      });
      if (located_.size() + batch.n > kMaxLocated) located_.clear();
    }
    for (size_t i = 0; i < batch.n; ++i) {
      const std::string& key = keys[batch.first + i];
      if (values[i].ok()) {
        present[batch.first + i] = true;
        located_.insert_or_assign(key, KeptLocation{*values[i], batch.lease_expiry});
      } else {
        // On another machine's pool: there, loaded over the network.
        present[batch.first + i] = absl::IsFailedPrecondition(values[i].status());
        located_.erase(key);
      }
    }
  }
  return present;
}

void GpuBlockMover::LoadRemote(absl::Span<const std::string> keys,
                               absl::Span<const int32_t> block_ids,
                               absl::Span<const size_t> owners,
                               std::vector<absl::Status>& results) {
  const size_t per_round = std::max<size_t>(1, load_.pinned_bytes / bytes_per_block_);
  for (size_t first = 0; first < owners.size(); first += per_round) {
    const size_t n = std::min(per_round, owners.size() - first);
    std::vector<GetItem> items;
    for (size_t k = 0; k < n; ++k) {
      uint8_t* object = load_.pinned + k * bytes_per_block_;
      items.push_back(GetItem{.key = keys[owners[first + k]],
                              .parts = {MutableBuffer{object, bytes_per_block_}}});
    }
    std::vector<absl::StatusOr<uint64_t>> got = client_.BatchGet(items);
    Batch batch;
    std::vector<size_t> copied_owners;
    for (size_t k = 0; k < n; ++k) {
      const size_t owner = owners[first + k];
      absl::StatusOr<uint64_t> result = k < got.size() ? got[k] : absl::InternalError("no result");
      if (!result.ok()) {
        results[owner] = result.status();
      } else if (*result != bytes_per_block_) {
        results[owner] = absl::InvalidArgumentError(
            absl::StrCat("object has ", *result, " bytes, a block ", bytes_per_block_));
      } else {
        batch.ids.push_back(block_ids[owner]);
        batch.objects.push_back(load_.pinned + k * bytes_per_block_);
        copied_owners.push_back(owner);
      }
    }
    absl::Status status = Launch(load_, batch, kernels::CopyDirection::kHostToDevice);
    if (status.ok() && !batch.ids.empty()) {
      if (cudaError_t e = cudaEventSynchronize(batch.done); e != cudaSuccess) {
        status = CudaError("copying blocks", e);
      }
    }
    for (size_t owner : copied_owners) results[owner] = status;
  }
}

}  // namespace kvpool::engine

namespace kvpool::engine {

// The state of one layer-wise load between StartLayerwiseLoad and Finish.
class GpuBlockMover::Layerwise : public LayerwiseLoad {
 public:
  explicit Layerwise(GpuBlockMover& mover) : mover_(mover) {}
  ~Layerwise() override {
    if (!finished_) (void)Finish();
  }
  int num_layers() const override { return mover_.num_layers(); }
  absl::Status WaitForLayer(int layer, uintptr_t stream) override {
    return mover_.WaitForLayer(layer, stream);
  }
  std::vector<absl::Status> Finish() override {
    if (finished_) return {};
    finished_ = true;
    return mover_.FinishLayerwise(*this);
  }

 private:
  friend class GpuBlockMover;
  GpuBlockMover& mover_;
  bool finished_ = false;
  bool queued_ = false;  // copies went out on the load stream
  bool busy_ = false;     // this load holds the mover's layer-wise state
  std::vector<absl::Status> results;
  std::vector<size_t> owners;      // keys whose blocks went out on the GPU
  std::vector<uint64_t> expected;  // their writers' checksums
  bool sums = false;               // checked on the GPU (into layerwise_sums_)
  absl::Status queue_status;       // a CUDA error while queuing
  absl::Time lease_expiry = absl::InfiniteFuture();
  std::atomic<int64_t> landed_us{0};  // when the last copy finished (a host function sets it)
};

absl::Status GpuBlockMover::WaitForLayer(int layer, uintptr_t stream) {
  if (layer < 0) return absl::InvalidArgumentError(absl::StrCat("negative layer ", layer));
  const size_t l = static_cast<size_t>(
      group_of_layer_[std::min(static_cast<size_t>(layer), group_of_layer_.size() - 1)]);
  cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaError_t e = cudaStreamIsCapturing(s, &capture); e != cudaSuccess) {
    return CudaError("asking whether the stream is capturing", e);
  }
  // In a graph being captured, an external wait: each replay waits for the event's latest
  // record (the load started before the replay), not for the one at capture. An event never
  // recorded is complete.
  cudaError_t e = cudaStreamWaitEvent(
      s, layer_events_[l],
      capture == cudaStreamCaptureStatusActive ? cudaEventWaitExternal : cudaEventWaitDefault);
  return e == cudaSuccess ? absl::OkStatus() : CudaError("waiting for a layer's load", e);
}

std::unique_ptr<LayerwiseLoad> GpuBlockMover::StartLayerwiseLoad(
    absl::Span<const std::string> keys, absl::Span<const int32_t> block_ids) {
  auto load = std::make_unique<Layerwise>(*this);
  load->results.assign(keys.size(), absl::OkStatus());
  absl::MutexLock lock(&load_.mu);
  if (layerwise_busy_) {
    load->results.assign(keys.size(), absl::FailedPreconditionError(
                                          "another layer-wise load of this cache is unfinished"));
    return load;
  }
  if (cudaError_t e = cudaSetDevice(device_); e != cudaSuccess) {
    load->results.assign(keys.size(), CudaError("selecting the cache's device", e));
    return load;
  }
  const bool gpu_sums = gpu_checksums_ && !force_remote_;
  if (gpu_sums) {
    if (absl::Status room = ReserveSums(layerwise_sums_, layerwise_sums_capacity_, keys.size());
        !room.ok()) {
      load->results.assign(keys.size(), room);
      return load;
    }
  }
  layerwise_busy_ = true;
  load->busy_ = true;
  std::vector<size_t> remote;
  std::vector<int32_t> ids;
  std::vector<uint8_t*> objects;
  // Copies layer group `g` of blocks [from, to) (g < 0: every group at once).
  auto copy_group = [&](int g, size_t from, size_t to) {
    const auto [first, count] =
        g < 0 ? std::pair<int, int>(0, static_cast<int>(segments_.size())) : layers_[g];
    uint64_t span = 0;
    for (int s = first; s < first + count; ++s) span += segments_[s].block_bytes;
    return kernels::CopyBlocks(segments_.data() + first, count, ids.data() + from,
                               objects.data() + from, static_cast<int>(to - from),
                               kernels::CopyDirection::kHostToDevice,
                               kernels::AutoCopyMethod(span, /*have_staging=*/true), load_.staging,
                               load_.stream);
  };
  // The first keys are copied whole, batch by batch as the master locates them (the copy
  // engines busy from the first answer on, as in LoadBlocks); the last layerwise_tail of them
  // layer group by layer group once all are located, each group's event after its copy. The
  // engine's layer g then runs while the tail's later groups still arrive.
  size_t tail = std::min(keys.size(), static_cast<size_t>(std::ceil(
                                          layerwise_tail_ * static_cast<double>(keys.size()))));
  if (layerwise_tail_max_bytes_ > 0) {
    tail = std::min<size_t>(tail,
                            std::max<uint64_t>(1, layerwise_tail_max_bytes_ / bytes_per_block_));
  }
  const size_t tail_from = keys.size() - tail;
  size_t tail_ids = 0;  // ids[tail_ids, ...) are the tail's (all of them with force_remote)
  cudaError_t e = cudaSuccess;
  if (force_remote_) {
    for (size_t i = 0; i < keys.size(); ++i) remote.push_back(i);
  } else {
    // Every batch located at once (the master answers them side by side); a batch's head
    // blocks are copied as soon as it is located, while later batches are still looked up.
    std::vector<Located> locating = LocateBatches(keys, Batches(keys.size(), first_batch_));
    for (Located& batch : locating) {
      std::vector<absl::StatusOr<LocalValue>> located = batch.values.get();
      load->lease_expiry = std::min(load->lease_expiry, batch.lease_expiry);
      absl::Status registered = RegisterNewPools();
      const size_t from = ids.size();
      for (size_t j = 0; j < batch.n; ++j) {
        const size_t i = batch.first + j;
        if (!located[j].ok()) {
          if (absl::IsFailedPrecondition(located[j].status())) {
            remote.push_back(i);
          } else {
            load->results[i] = located[j].status();
          }
        } else if (!registered.ok()) {
          load->results[i] = registered;
        } else if (located[j]->size != bytes_per_block_) {
          load->results[i] = absl::InvalidArgumentError(absl::StrCat(
              "object has ", located[j]->size, " bytes, a block ", bytes_per_block_));
        } else {
          ids.push_back(block_ids[i]);
          objects.push_back(located[j]->data);
          load->owners.push_back(i);
          load->expected.push_back(located[j]->checksum);
        }
      }
      // The head's blocks of this batch, whole.
      size_t head_end = ids.size();
      while (head_end > from && load->owners[head_end - 1] >= tail_from) --head_end;
      if (e == cudaSuccess && head_end > from) e = copy_group(-1, from, head_end);
    }
    tail_ids = static_cast<size_t>(
        std::lower_bound(load->owners.begin(), load->owners.end(), tail_from) -
        load->owners.begin());
  }
  if (!remote.empty()) LoadRemote(keys, block_ids, remote, load->results);
  if (ids.empty()) return load;
  // Step G2, layer by layer: every block's layers of group g, then the event their waits are
  // on; the checksums once the last group landed, beside the engine's work.
  for (size_t g = 0; g < layers_.size() && e == cudaSuccess; ++g) {
    if (ids.size() > tail_ids) e = copy_group(static_cast<int>(g), tail_ids, ids.size());
    if (e == cudaSuccess) e = cudaEventRecord(layer_events_[g], load_.stream);
  }
  if (e == cudaSuccess) e = cudaStreamWaitEvent(load_.sum_stream, layer_events_.back(), 0);
  if (e == cudaSuccess && gpu_sums) {
    e = kernels::ChecksumBlocks(segments_.data(), static_cast<int>(segments_.size()), ids.data(),
                                static_cast<int>(ids.size()), layerwise_sums_, load_.sum_stream);
    load->sums = e == cudaSuccess;
  }
  if (e == cudaSuccess) {
    // When the copies (and checksums) were done, for the lease: the engine may finish later.
    e = cudaLaunchHostFunc(
        load_.sum_stream,
        [](void* landed) {
          static_cast<std::atomic<int64_t>*>(landed)->store(absl::ToUnixMicros(absl::Now()));
        },
        &load->landed_us);
  }
  if (e == cudaSuccess) e = cudaEventRecord(layerwise_done_, load_.sum_stream);
  load->queued_ = true;
  if (e != cudaSuccess) load->queue_status = CudaError("queuing a layer-wise load", e);
  return load;
}

std::vector<absl::Status> GpuBlockMover::FinishLayerwise(Layerwise& load) {
  absl::MutexLock lock(&load_.mu);
  std::vector<absl::Status> results = std::move(load.results);
  if (!load.busy_) return results;
  load.busy_ = false;
  layerwise_busy_ = false;
  if (load.owners.empty()) return results;
  absl::Status status = load.queue_status;
  if (status.ok()) {
    if (cudaError_t e = cudaEventSynchronize(layerwise_done_); e != cudaSuccess) {
      status = CudaError("loading blocks", e);
    }
  }
  if (status.ok() && absl::FromUnixMicros(load.landed_us.load()) > load.lease_expiry) {
    status = ErrorStatus(v1::LEASE_EXPIRED, "the copy outlasted the lease; load again");
  }
  for (size_t k = 0; k < load.owners.size(); ++k) {
    results[load.owners[k]] =
        status.ok() && load.sums && load.expected[k] != 0 && layerwise_sums_[k] != load.expected[k]
            ? ErrorStatus(v1::CHECKSUM_MISMATCH,
                          "the block loaded does not match its writer's checksum; recompute it")
            : status;
  }
  return results;
}

}  // namespace kvpool::engine
