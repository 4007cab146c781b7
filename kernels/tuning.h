#pragma once

// Benchmark-only overrides of the launchers' own choices, so that kvpool-kernels-bench can time
// variants side by side in one run. Zero everywhere means "the launcher decides", which is what
// every other caller gets. Not thread-safe: set it before launching, from one thread.

namespace kvpool::kernels {

struct KernelTuning {
  int gqa_warps = 0;  // 8: eight kv heads per GQA block (one block per SM) instead of four
  // MLA: 1: the previous kernel (eight warps per 16 heads, scores split over key-dim quarters);
  // 2: the same with one block per SM and a deeper ring (16-head groups); 3: the current kernel
  // with 16 heads per block even where the heads come in multiples of 32; 4: the current kernel
  // with one bulk copy per row instead of tensor copies of 64-element column slabs.
  int mla_variant = 0;
};

void SetKernelTuning(const KernelTuning& tuning);
const KernelTuning& GetKernelTuning();

}  // namespace kvpool::kernels
