#pragma once

// The few CUDA driver entry points that let host code tell device memory from host memory and
// move bytes between them, looked up in a libcuda.so.1 this process has loaded already (by
// torch, or by anything else that uses CUDA). Nothing here loads the driver or creates a
// context: a process that never touched CUDA has no device memory, and LoadIfPresent says so.
// The types are the driver's ABI (cuda.h), spelled here so that builds without the CUDA
// toolkit (CI) compile the same code. A table of plain function pointers: a test can fill one
// with fakes.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

namespace kvpool::engine {

struct CudaDriver {
  using Result = int;          // CUresult; 0 is CUDA_SUCCESS
  using DevicePtr = uint64_t;  // CUdeviceptr
  using Context = void*;       // CUcontext
  using Stream = void*;        // CUstream

  // CUpointer_attribute and CUmemorytype values (cuda.h).
  static constexpr int kAttributeContext = 1;
  static constexpr int kAttributeMemoryType = 2;
  static constexpr int kAttributeIsManaged = 8;
  static constexpr int kAttributeRangeStart = 11;
  static constexpr int kAttributeRangeSize = 12;
  static constexpr unsigned kMemoryTypeDevice = 2;
  static constexpr unsigned kHostAllocPortable = 1;  // CU_MEMHOSTALLOC_PORTABLE
  static constexpr unsigned kStreamNonBlocking = 1;  // CU_STREAM_NON_BLOCKING

  Result (*PointerGetAttributes)(unsigned count, int* attributes, void** data, DevicePtr ptr);
  Result (*CtxPushCurrent)(Context context);
  Result (*CtxPopCurrent)(Context* context);
  Result (*MemHostAlloc)(void** ptr, size_t bytes, unsigned flags);
  Result (*MemFreeHost)(void* ptr);
  Result (*StreamCreate)(Stream* stream, unsigned flags);
  Result (*StreamDestroy)(Stream stream);
  Result (*StreamSynchronize)(Stream stream);
  Result (*MemcpyDtoHAsync)(void* dst, DevicePtr src, size_t bytes, Stream stream);
  Result (*MemcpyHtoDAsync)(DevicePtr dst, const void* src, size_t bytes, Stream stream);
  Result (*GetErrorString)(Result result, const char** text);

  // The driver's entry points if libcuda.so.1 is loaded in this process (never loads it);
  // nullopt otherwise, or if one of them is missing. Costs about 90 us when it is not loaded
  // (dlopen searches for it): repeat it only once LoadedObjects() has grown.
  static std::optional<CudaDriver> LoadIfPresent();
  // How many shared objects this process has loaded so far (dl_iterate_phdr's dlpi_adds; a
  // few nanoseconds).
  static uint64_t LoadedObjects();

  // "cuName: <the driver's text for result>".
  std::string Describe(const char* call, Result result) const;
};

}  // namespace kvpool::engine
