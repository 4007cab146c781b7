#pragma once

// Benchmark-only overrides of the launchers' own choices, so that kvpool-kernels-bench can time
// variants side by side in one run. Zero everywhere means "the launcher decides", which is what
// every other caller gets. Not thread-safe: set it before launching, from one thread.

namespace kvpool::kernels {

struct KernelTuning {
  int gqa_warps = 0;     // warps (kv heads) per GQA block: 4 or 8
  int mla_stages = 0;    // 1: the deep ring variant of the MLA kernel (one block per SM)
};

void SetKernelTuning(const KernelTuning& tuning);
const KernelTuning& GetKernelTuning();

}  // namespace kvpool::kernels
