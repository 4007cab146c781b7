#include "engine_plugin/gpu_block_mover.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "kernels/block_copy.cuh"
#include "proto/error_codes.h"

namespace kvpool::engine {
namespace {

absl::Status CudaError(absl::string_view what, cudaError_t error) {
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorString(error)));
}

// Blocks per CopyBlocks call and per pool round trip. The first batch of a call is smaller, so
// that the GPU starts copying after one short round trip and the later round trips overlap
// copies already queued.
constexpr size_t kBatch = 256;
constexpr size_t kFirstBatch = 32;

}  // namespace

absl::StatusOr<std::unique_ptr<GpuBlockMover>> GpuBlockMover::Create(Client& client,
                                                                     const KvCacheLayout& layout,
                                                                     cudaStream_t stream) {
  return Create(client, layout,
                GpuBlockMoverOptions{.store_stream = stream, .load_stream = stream});
}

absl::StatusOr<std::unique_ptr<GpuBlockMover>> GpuBlockMover::Create(
    Client& client, const KvCacheLayout& layout, GpuBlockMoverOptions options) {
  std::unique_ptr<GpuBlockMover> mover(new GpuBlockMover(client, options.force_remote));
  if (cudaError_t e = cudaGetDevice(&mover->device_); e != cudaSuccess) {
    return CudaError("finding the current device", e);
  }
  for (const KvSegment& segment : layout.segments()) {
    mover->segments_.push_back(kernels::KvSegment{segment.base, segment.block_bytes,
                                                  segment.block_bytes, mover->bytes_per_block_});
    mover->bytes_per_block_ += segment.block_bytes;
  }
  if (mover->bytes_per_block_ == 0) return absl::InvalidArgumentError("the layout has no bytes");
  const uint64_t pinned = std::max(options.pinned_staging_bytes, mover->bytes_per_block_);
  if (absl::Status s = mover->SetUp(mover->store_, options.store_stream, pinned); !s.ok()) return s;
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
  return absl::OkStatus();
}

GpuBlockMover::~GpuBlockMover() {
  for (Direction* direction : {&store_, &load_}) {
    absl::MutexLock lock(&direction->mu);
    if (direction->stream != nullptr) cudaStreamSynchronize(direction->stream);
    if (direction->staging.device != nullptr) cudaFree(direction->staging.device);
    if (direction->pinned != nullptr) cudaFreeHost(direction->pinned);
    if (direction->own_stream) cudaStreamDestroy(direction->stream);
  }
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

GpuBlockMover::Batch::Batch() { cudaEventCreateWithFlags(&done, cudaEventDisableTiming); }
GpuBlockMover::Batch::~Batch() { cudaEventDestroy(done); }

std::vector<absl::Status> GpuBlockMover::StoreBlocks(absl::Span<const std::string> keys,
                                                     absl::Span<const int32_t> block_ids) {
  absl::MutexLock lock(&store_.mu);
  std::vector<absl::Status> results(keys.size());
  if (cudaError_t e = cudaSetDevice(device_); e != cudaSuccess) {
    results.assign(keys.size(), CudaError("selecting the cache's device", e));
    return results;
  }
  std::vector<size_t> remote;  // keys for the network path
  // Batch k's copy runs on the GPU while batch k+1 is reserved and batch k-1 committed.
  auto commit = [&](Batch& batch) {
    cudaError_t e = cudaEventSynchronize(batch.done);
    if (e != cudaSuccess) {
      client_.BatchAbandonLocal(batch.reservations);
      for (size_t owner : batch.owners) results[owner] = CudaError("copying blocks", e);
      return;
    }
    std::vector<absl::Status> committed = client_.BatchCommitLocal(batch.reservations);
    for (size_t k = 0; k < batch.owners.size(); ++k) results[batch.owners[k]] = committed[k];
  };
  std::unique_ptr<Batch> previous;
  for (size_t first = 0, n = 0; first < keys.size() && !force_remote_; first += n) {
    n = std::min(first == 0 ? kFirstBatch : kBatch, keys.size() - first);
    std::vector<uint64_t> sizes(n, bytes_per_block_);
    std::vector<absl::StatusOr<LocalReservation>> reserved =
        client_.BatchReserveLocal(keys.subspan(first, n), sizes);
    absl::Status registered = RegisterNewPools();
    auto batch = std::make_unique<Batch>();
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
    }
    // Step P2 for a GPU cache: the GPU writes each block straight into its reserved space.
    absl::Status launched = registered.ok()
                                ? Launch(store_, *batch, kernels::CopyDirection::kDeviceToHost)
                                : registered;
    if (!launched.ok()) {
      client_.BatchAbandonLocal(batch->reservations);
      for (size_t owner : batch->owners) results[owner] = launched;
      continue;
    }
    if (previous) commit(*previous);
    previous = std::move(batch);
  }
  if (previous) commit(*previous);
  if (force_remote_) {
    for (size_t i = 0; i < keys.size(); ++i) remote.push_back(i);
  }
  if (!remote.empty()) StoreRemote(keys, block_ids, remote, results);
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
  std::vector<absl::Status> results(keys.size());
  if (cudaError_t e = cudaSetDevice(device_); e != cudaSuccess) {
    results.assign(keys.size(), CudaError("selecting the cache's device", e));
    return results;
  }
  std::vector<size_t> remote;
  // Every batch's copy is queued on the stream as soon as it is located, so the next batch is
  // located while the GPU copies; one wait at the end.
  std::vector<std::unique_ptr<Batch>> launched;
  for (size_t first = 0, n = 0; first < keys.size() && !force_remote_; first += n) {
    n = std::min(first == 0 ? kFirstBatch : kBatch, keys.size() - first);
    auto batch = std::make_unique<Batch>();
    std::vector<absl::StatusOr<LocalValue>> located =
        client_.BatchGetLocal(keys.subspan(first, n), &batch->lease_expiry);
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
      }
    }
    // Step G2 for a GPU cache: the GPU reads each block straight from the pool.
    absl::Status status = registered.ok()
                              ? Launch(load_, *batch, kernels::CopyDirection::kHostToDevice)
                              : registered;
    if (!status.ok()) {
      for (size_t owner : batch->owners) results[owner] = status;
      continue;
    }
    launched.push_back(std::move(batch));
  }
  cudaError_t e = cudaStreamSynchronize(load_.stream);
  absl::Time finished = absl::Now();
  for (const std::unique_ptr<Batch>& batch : launched) {
    absl::Status status =
        e != cudaSuccess            ? CudaError("copying blocks", e)
        : finished > batch->lease_expiry
            ? ErrorStatus(v1::LEASE_EXPIRED, "the copy outlasted the lease; load again")
            : absl::OkStatus();
    for (size_t owner : batch->owners) results[owner] = status;
  }
  if (force_remote_) {
    for (size_t i = 0; i < keys.size(); ++i) remote.push_back(i);
  }
  if (!remote.empty()) LoadRemote(keys, block_ids, remote, results);
  return results;
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
