#pragma once

// Benchmark-only overrides of the launchers' own choices, so that kvpool-kernels-bench can time
// variants side by side in one run. Zero everywhere means "the launcher decides", which is what
// every other caller gets. Not thread-safe: set it before launching, from one thread.

namespace kvpool::kernels {

struct KernelTuning {
  int gqa_warps = 0;   // 8: eight kv heads per GQA block (one block per SM) instead of four
  int mla_stages = 0;  // 1: the deep-ring MLA variant (one block per SM) for 16-head groups
};

void SetKernelTuning(const KernelTuning& tuning);
const KernelTuning& GetKernelTuning();

}  // namespace kvpool::kernels
