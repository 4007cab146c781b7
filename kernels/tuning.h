#pragma once

// Benchmark-only overrides of the launchers' own choices, so that kvpool-kernels-bench can
// time variants side by side in one run. 0 everywhere means "the launcher decides", which is
// what every other caller gets. Not thread-safe: set it before launching, from one thread.

namespace kvpool::kernels {

struct KernelTuning {
  int mla_pipeline = 0;  // 1: shallow ring, two blocks per SM; 2: deep ring, one block per SM
};

void SetKernelTuning(const KernelTuning& tuning);
const KernelTuning& GetKernelTuning();

}  // namespace kvpool::kernels
