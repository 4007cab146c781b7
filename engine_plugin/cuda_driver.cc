#include "engine_plugin/cuda_driver.h"

#include <dlfcn.h>
#include <link.h>

#include "absl/strings/str_cat.h"

namespace kvpool::engine {
namespace {

template <typename F>
bool Find(void* library, const char* name, F*& out) {
  out = reinterpret_cast<F*>(dlsym(library, name));
  return out != nullptr;
}

}  // namespace

std::optional<CudaDriver> CudaDriver::LoadIfPresent() {
  // RTLD_NOLOAD: a handle only if the driver is mapped already; the reference it takes is
  // kept for the process's life (the driver is never unloaded while CUDA is in use anyway).
  void* library = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (library == nullptr) return std::nullopt;
  CudaDriver d;
  // The versioned names are the ones cuda.h maps the plain ones to.
  bool found = Find(library, "cuPointerGetAttributes", d.PointerGetAttributes) &&
               Find(library, "cuCtxPushCurrent_v2", d.CtxPushCurrent) &&
               Find(library, "cuCtxPopCurrent_v2", d.CtxPopCurrent) &&
               Find(library, "cuMemHostAlloc", d.MemHostAlloc) &&
               Find(library, "cuMemFreeHost", d.MemFreeHost) &&
               Find(library, "cuStreamCreate", d.StreamCreate) &&
               Find(library, "cuStreamDestroy_v2", d.StreamDestroy) &&
               Find(library, "cuStreamSynchronize", d.StreamSynchronize) &&
               Find(library, "cuMemcpyDtoHAsync_v2", d.MemcpyDtoHAsync) &&
               Find(library, "cuMemcpyHtoDAsync_v2", d.MemcpyHtoDAsync) &&
               Find(library, "cuGetErrorString", d.GetErrorString);
  if (!found) return std::nullopt;
  return d;
}

uint64_t CudaDriver::LoadedObjects() {
  uint64_t adds = 0;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) {
        *static_cast<uint64_t*>(data) = info->dlpi_adds;
        return 1;  // the count is the same in every entry: the first is enough
      },
      &adds);
  return adds;
}

std::string CudaDriver::Describe(const char* call, Result result) const {
  const char* text = nullptr;
  if (GetErrorString == nullptr || GetErrorString(result, &text) != 0 || text == nullptr) {
    return absl::StrCat(call, ": CUDA error ", result);
  }
  return absl::StrCat(call, ": ", text);
}

}  // namespace kvpool::engine
