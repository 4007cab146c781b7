#pragma once

// GPU-versus-CPU-reference checks of every kernel in kernels/, as plain functions so that both
// the GoogleTest binary (kernels_gpu_test, label gpu) and the self-contained driver that runs on
// GPU machines without GoogleTest (kvpool-kernels-check) use the same code.

#include <cstdint>
#include <string>
#include <vector>

namespace kvpool::kernels::testing {

struct CheckResult {
  std::string name;
  bool ok = false;
  double error = 0.0;  // relative L2 error of the outputs (0 for exact copies)
  std::string detail;  // what went wrong, or a short summary
};

// Number of CUDA devices (0 if the driver or runtime is missing).
int CudaDeviceCount();

// Block gather/scatter: kernel and copy-engine paths, pinned and registered host memory,
// FlashAttention- and FlashInfer-style segments, unaligned sizes, requests that need several
// launches. Exact comparisons.
std::vector<CheckResult> CheckBlockCopy(uint64_t seed);

// GQA decode over every dtype, head_dim, block size, layout and head grouping, with ragged
// lengths (1, non-multiples of the block size, 0), shuffled block tables, NaN in unused slots,
// and sequences long enough to be split.
std::vector<CheckResult> CheckGqaDecode(uint64_t seed);

// MLA decode over bf16/fp16/fp8 caches, 16..128 heads and several block sizes, likewise.
std::vector<CheckResult> CheckMlaDecode(uint64_t seed);

}  // namespace kvpool::kernels::testing
