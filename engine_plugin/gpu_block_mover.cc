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

absl::Status GpuBlockMover::Copy(const std::vector<int32_t>& block_ids,
                                 const std::vector<uint8_t*>& objects,
                                 kernels::CopyDirection direction) {
  if (block_ids.empty()) return absl::OkStatus();
  cudaError_t e = kernels::CopyBlocks(
      segments_.data(), static_cast<int>(segments_.size()), block_ids.data(), objects.data(),
      static_cast<int>(block_ids.size()), direction,
      kernels::AutoCopyMethod(bytes_per_block_, /*have_staging=*/true), staging_, stream_);
  if (e == cudaSuccess) e = cudaStreamSynchronize(stream_);
  return e == cudaSuccess ? absl::OkStatus() : CudaError("copying blocks", e);
}

std::vector<absl::Status> GpuBlockMover::StoreBlocks(absl::Span<const std::string> keys,
                                                     absl::Span<const int32_t> block_ids) {
  std::vector<absl::Status> results(keys.size());
  for (size_t first = 0; first < keys.size(); first += kBatch) {
    size_t n = std::min(kBatch, keys.size() - first);
    std::vector<uint64_t> sizes(n, bytes_per_block_);
    std::vector<absl::StatusOr<LocalReservation>> reserved =
        client_.BatchReserveLocal(keys.subspan(first, n), sizes);
    absl::Status registered = RegisterNewPools();
    std::vector<LocalReservation> filled;
    std::vector<int32_t> ids;
    std::vector<uint8_t*> objects;
    std::vector<size_t> owners;
    for (size_t i = 0; i < n; ++i) {
      if (!reserved[i].ok()) {
        // Already in the pool counts as stored (dedup).
        bool exists = ToErrorCode(reserved[i].status()) == v1::OBJECT_ALREADY_EXISTS;
        results[first + i] = exists ? absl::OkStatus() : reserved[i].status();
        continue;
      }
      filled.push_back(*reserved[i]);
      ids.push_back(block_ids[first + i]);
      objects.push_back(reserved[i]->data);
      owners.push_back(first + i);
    }
    // Step P2 for a GPU cache: the GPU writes each block straight into its reserved space.
    absl::Status copied = registered.ok()
                              ? Copy(ids, objects, kernels::CopyDirection::kDeviceToHost)
                              : registered;
    if (!copied.ok()) {
      client_.BatchAbandonLocal(filled);
      for (size_t owner : owners) results[owner] = copied;
      continue;
    }
    std::vector<absl::Status> committed = client_.BatchCommitLocal(filled);
    for (size_t k = 0; k < owners.size(); ++k) results[owners[k]] = committed[k];
  }
  return results;
}

std::vector<absl::Status> GpuBlockMover::LoadBlocks(absl::Span<const std::string> keys,
                                                    absl::Span<const int32_t> block_ids) {
  std::vector<absl::Status> results(keys.size());
  for (size_t first = 0; first < keys.size(); first += kBatch) {
    size_t n = std::min(kBatch, keys.size() - first);
    absl::Time lease_expiry;
    std::vector<absl::StatusOr<LocalValue>> located =
        client_.BatchGetLocal(keys.subspan(first, n), &lease_expiry);
    absl::Status registered = RegisterNewPools();
    std::vector<int32_t> ids;
    std::vector<uint8_t*> objects;
    std::vector<size_t> owners;
    for (size_t i = 0; i < n; ++i) {
      if (!located[i].ok()) {
        results[first + i] = located[i].status();
      } else if (located[i]->size != bytes_per_block_) {
        results[first + i] = absl::InvalidArgumentError(
            absl::StrCat("object has ", located[i]->size, " bytes, a block ", bytes_per_block_));
      } else {
        ids.push_back(block_ids[first + i]);
        objects.push_back(located[i]->data);
        owners.push_back(first + i);
      }
    }
    // Step G2 for a GPU cache: the GPU reads each block straight from the pool.
    absl::Status copied =
        registered.ok() ? Copy(ids, objects, kernels::CopyDirection::kHostToDevice) : registered;
    if (copied.ok() && absl::Now() > lease_expiry) {
      copied = ErrorStatus(v1::LEASE_EXPIRED, "the copy outlasted the lease; load again");
    }
    for (size_t owner : owners) results[owner] = copied;
  }
  return results;
}

}  // namespace kvpool::engine
