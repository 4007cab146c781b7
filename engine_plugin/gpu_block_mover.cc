#include "engine_plugin/gpu_block_mover.h"

#include "absl/strings/str_cat.h"
#include "kernels/block_copy.cuh"
#include "proto/error_codes.h"

namespace kvpool::engine {
namespace {

absl::Status CudaError(absl::string_view what, cudaError_t error) {
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorString(error)));
}

// Blocks per CopyBlocks call and per pool round trip.
constexpr size_t kBatch = 256;

}  // namespace

absl::StatusOr<std::unique_ptr<GpuBlockMover>> GpuBlockMover::Create(Client& client,
                                                                     const KvCacheLayout& layout,
                                                                     cudaStream_t stream) {
  std::unique_ptr<GpuBlockMover> mover(new GpuBlockMover(client, stream));
  for (const KvSegment& segment : layout.segments()) {
    mover->segments_.push_back(kernels::KvSegment{segment.base, segment.block_bytes,
                                                  segment.block_bytes, mover->bytes_per_block_});
    mover->bytes_per_block_ += segment.block_bytes;
  }
  // Room to stage a few whole block objects in device memory (CopyMethod::kStaged).
  mover->staging_.bytes = std::max<uint64_t>(mover->bytes_per_block_ * 8, 16 << 20);
  if (cudaError_t e = cudaMalloc(&mover->staging_.device, mover->staging_.bytes); e != cudaSuccess) {
    return CudaError("allocating the copy staging buffer", e);
  }
  client.MapLocalPools();
  if (absl::Status registered = mover->RegisterNewPools(); !registered.ok()) return registered;
  return mover;
}

GpuBlockMover::~GpuBlockMover() {
  for (uint8_t* base : registered_) cudaHostUnregister(base);
  if (staging_.device != nullptr) cudaFree(staging_.device);
}

absl::Status GpuBlockMover::RegisterNewPools() {
  for (const MappedPool& pool : client_.MappedPools()) {
    if (registered_.contains(pool.base)) continue;
    cudaError_t e = cudaHostRegister(pool.base, pool.size, cudaHostRegisterDefault);
    if (e != cudaSuccess && e != cudaErrorHostMemoryAlreadyRegistered) {
      return CudaError(absl::StrCat("registering the pool of ", pool.endpoint), e);
    }
    cudaGetLastError();  // clear an "already registered"
    registered_.insert(pool.base);
  }
  return absl::OkStatus();
}

absl::Status GpuBlockMover::Launch(const Batch& batch, kernels::CopyDirection direction) {
  if (batch.ids.empty()) return absl::OkStatus();
  cudaError_t e = kernels::CopyBlocks(
      segments_.data(), static_cast<int>(segments_.size()), batch.ids.data(),
      batch.objects.data(), static_cast<int>(batch.ids.size()), direction,
      kernels::AutoCopyMethod(bytes_per_block_, /*have_staging=*/true), staging_, stream_);
  if (e == cudaSuccess) e = cudaEventRecord(batch.done, stream_);
  return e == cudaSuccess ? absl::OkStatus() : CudaError("copying blocks", e);
}

GpuBlockMover::Batch::Batch() { cudaEventCreateWithFlags(&done, cudaEventDisableTiming); }
GpuBlockMover::Batch::~Batch() { cudaEventDestroy(done); }

std::vector<absl::Status> GpuBlockMover::StoreBlocks(absl::Span<const std::string> keys,
                                                     absl::Span<const int32_t> block_ids) {
  std::vector<absl::Status> results(keys.size());
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
  for (size_t first = 0; first < keys.size(); first += kBatch) {
    size_t n = std::min(kBatch, keys.size() - first);
    std::vector<uint64_t> sizes(n, bytes_per_block_);
    std::vector<absl::StatusOr<LocalReservation>> reserved =
        client_.BatchReserveLocal(keys.subspan(first, n), sizes);
    absl::Status registered = RegisterNewPools();
    auto batch = std::make_unique<Batch>();
    for (size_t i = 0; i < n; ++i) {
      if (!reserved[i].ok()) {
        // Already in the pool counts as stored (dedup).
        bool exists = ToErrorCode(reserved[i].status()) == v1::OBJECT_ALREADY_EXISTS;
        results[first + i] = exists ? absl::OkStatus() : reserved[i].status();
        continue;
      }
      batch->reservations.push_back(*reserved[i]);
      batch->ids.push_back(block_ids[first + i]);
      batch->objects.push_back(reserved[i]->data);
      batch->owners.push_back(first + i);
    }
    // Step P2 for a GPU cache: the GPU writes each block straight into its reserved space.
    absl::Status launched =
        registered.ok() ? Launch(*batch, kernels::CopyDirection::kDeviceToHost) : registered;
    if (!launched.ok()) {
      client_.BatchAbandonLocal(batch->reservations);
      for (size_t owner : batch->owners) results[owner] = launched;
      continue;
    }
    if (previous) commit(*previous);
    previous = std::move(batch);
  }
  if (previous) commit(*previous);
  return results;
}

std::vector<absl::Status> GpuBlockMover::LoadBlocks(absl::Span<const std::string> keys,
                                                    absl::Span<const int32_t> block_ids) {
  std::vector<absl::Status> results(keys.size());
  // Every batch's copy is queued on the stream as soon as it is located, so the next batch is
  // located while the GPU copies; one wait at the end.
  std::vector<std::unique_ptr<Batch>> launched;
  for (size_t first = 0; first < keys.size(); first += kBatch) {
    size_t n = std::min(kBatch, keys.size() - first);
    auto batch = std::make_unique<Batch>();
    std::vector<absl::StatusOr<LocalValue>> located =
        client_.BatchGetLocal(keys.subspan(first, n), &batch->lease_expiry);
    absl::Status registered = RegisterNewPools();
    for (size_t i = 0; i < n; ++i) {
      if (!located[i].ok()) {
        results[first + i] = located[i].status();
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
    absl::Status status =
        registered.ok() ? Launch(*batch, kernels::CopyDirection::kHostToDevice) : registered;
    if (!status.ok()) {
      for (size_t owner : batch->owners) results[owner] = status;
      continue;
    }
    launched.push_back(std::move(batch));
  }
  cudaError_t e = cudaStreamSynchronize(stream_);
  absl::Time finished = absl::Now();
  for (const std::unique_ptr<Batch>& batch : launched) {
    absl::Status status =
        e != cudaSuccess            ? CudaError("copying blocks", e)
        : finished > batch->lease_expiry
            ? ErrorStatus(v1::LEASE_EXPIRED, "the copy outlasted the lease; load again")
            : absl::OkStatus();
    for (size_t owner : batch->owners) results[owner] = status;
  }
  return results;
}

}  // namespace kvpool::engine
