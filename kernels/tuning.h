#pragma once

// Benchmark-only overrides of the launchers' own choices, so that kvpool-kernels-bench can time
// variants side by side in one run. Zero everywhere means "the launcher decides", which is what
// every other caller gets. Not thread-safe: set it before launching, from one thread.

namespace kvpool::kernels {

struct KernelTuning {
  int gqa_warps = 0;  // 8: eight kv heads per GQA block (one block per SM) instead of four
  // GQA: 1: the previous schedule (about four work items per resident block, always taken from
  // the work counter); 2: the planned schedule without thread block clusters (split sequences
  // always merged by the merge kernel).
  int gqa_schedule = 0;
  int gqa_chunk = 0;  // GQA: tokens per work item (a multiple of 16) instead of the planned ones

  // MLA: 1: the previous kernel (eight warps per 16 heads, scores split over key-dim quarters);
  // 2: the same with one block per SM and a deeper ring (16-head groups); 3: the current kernel
  // with 16 heads per block even where the heads come in multiples of 32; 4: the current kernel
  // with one bulk copy per row instead of tensor copies of 64-element column slabs.
  int mla_variant = 0;
};

void SetKernelTuning(const KernelTuning& tuning);
const KernelTuning& GetKernelTuning();

// What the last GQA launch did, for the benchmark's notes.
struct GqaScheduleInfo {
  int chunk = 0;          // tokens per work item
  int splits = 0;         // at most, per sequence
  int items = 0;          // work items
  int grid = 0;           // thread blocks
  bool one_item = false;  // one item per block, no work counter
  bool cluster = false;   // splits merged inside thread block clusters, no merge kernel
};
void SetLastGqaSchedule(const GqaScheduleInfo& info);
const GqaScheduleInfo& LastGqaSchedule();

}  // namespace kvpool::kernels
