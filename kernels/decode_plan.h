#pragma once

// The host half of the decode kernels' plan/run split (as FlashInfer's): a planner that sees the
// real sequence lengths cuts every (sequence, head group) into work items, and the launch takes
// the resulting plan as an explicit argument. Plain C++ (no CUDA), shared by GqaDecode and
// MlaDecode and unit-tested on the CPU. No global state: two threads may plan and launch at once
// (each with its own workspace).

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace kvpool::kernels {

// The outcome of planning or launching: ok, or why not. `cuda_error` holds the cudaError_t value
// (cudaErrorInvalidValue, 1, for a configuration the kernels refuse), `reason` says why.
struct KernelStatus {
  int cuda_error = 0;
  std::string reason;
  bool ok() const { return cuda_error == 0; }
  static KernelStatus Ok() { return {}; }
  static KernelStatus Refused(std::string why) { return {1, std::move(why)}; }
};

// One work item, as the kernels read it from the workspace (32 bytes). Tokens [start, end) of
// sequence `seq` for head group `unit`; `end` is INT32_MAX for the last item of a sequence, which
// runs to the sequence's length on the device (so a plan made for shorter lengths still covers
// every token). slot < 0: the item is the whole sequence and writes the output directly;
// otherwise it writes partial result `slot`, merged by the merge kernel. `next`: in a plan whose
// blocks follow chains (SplitPlan::Chained), the item the same block takes after this one
// (-1: none).
struct DecodeWorkItem {
  int32_t seq = 0;
  int32_t unit = 0;
  int32_t start = 0;
  int32_t end = 0;
  int32_t slot = -1;
  int32_t next = -1;
  int32_t pad[2] = {0, 0};
};

// One split sequence for the merge kernel (16 bytes): partial slots [slot0, slot0 + splits).
struct DecodeMergeItem {
  int32_t seq = 0;
  int32_t slot0 = 0;
  int32_t splits = 0;
  int32_t pad = 0;
};

// What the planner is told about one launch.
struct SplitPlanInput {
  int batch = 0;
  int units_per_seq = 1;              // independent head groups per sequence
  const int32_t* seq_lens = nullptr;  // host copy of the lengths [batch]; null: all max_seq_len
  int max_seq_len = 0;
  int ctas = 0;        // resident thread blocks on the device
  int granule = 16;    // tokens; every item but a sequence's last is a multiple
  int min_chunk = 16;  // tokens: no item is cut shorter (a multiple of granule)
  // Cost model, in microseconds: one block streaming one granule of one unit while all blocks
  // stream; the fixed cost of an item (taking it, loading query and block table, first tile);
  // the merge kernel's launch and tail, and its time per split of the most split sequence (its
  // warps walk the splits); the work counter's reset.
  double granule_us = 0.1;
  double item_us = 5.0;
  double merge_us = 4.0;
  double merge_split_us = 0.02;
  double counter_us = 2.0;
  int max_slots = 0;     // at most this many partial results (0: no splits at all)
  int forced_chunk = 0;  // > 0: cut at exactly this many tokens (a multiple of granule)
  bool uniform = false;  // ignore seq_lens: plan as if every sequence had max_seq_len
  // Keep to one wave: no cut with more items than resident blocks when the unsplit plan has no
  // more (for kernels whose blocks speed up when others finish, which the model does not see).
  bool one_wave = false;
  // Also weigh spans: the batch's work (every sequence's granules, in batch order, plus each
  // item's fixed cost) cut into `ctas` equal spans, one per block, a sequence cut where a span
  // ends, so that every block streams the same amount whatever the lengths (FlashMLA's
  // scheduler does this); taken where modelled 10% faster and the partial results fit
  // max_slots. For kernels that follow chains (DecodeWorkItem::next).
  bool spans = false;
  bool force_spans = false;  // with spans: take the span plan whenever it fits (for comparison)
};

// The planner's decisions.
struct SplitPlan {
  int chunk = 0;  // tokens of the longest item
  int slots = 0;  // partial results written
  int max_splits = 1;
  // In the order blocks take them: longest first from the work counter, or (one_item, spans)
  // block i's chain starting at item i.
  std::vector<DecodeWorkItem> items;
  std::vector<DecodeMergeItem> merges;
  bool one_item = false;  // items <= resident blocks: block i takes item i (no work counter)
  bool spans = false;     // one span per block: block i takes item i, then its `next` ones
  int grid = 0;           // thread blocks to launch
  double modelled_us = 0;
  // Blocks follow chains from item blockIdx (no work counter): one item each, or spans.
  bool Chained() const { return one_item || spans; }
};

// Cuts the batch into items: of the chunk sizes that divide the longest sequence into 1, 2, 3,
// ... equal parts (each sequence cut into equal parts of at most that size; every n to 64,
// then coarser, plus the n that make whole waves), the one whose
// modelled finish time is least (longest-first list scheduling onto `ctas` blocks, plus the
// merge and the counter reset), preferring fewer items within 2%; or the span plan (`spans`).
// A refusal names its reason.
KernelStatus PlanSplits(const SplitPlanInput& in, SplitPlan* plan);

// Upper bounds of a plan's item count and partial slots for any lengths up to max_seq_len
// (sizes the workspace).
int64_t MaxPlanItems(const SplitPlanInput& in);
int64_t MaxPlanSlots(const SplitPlanInput& in);

// The workspace the kernels use: [counter 256 B][items][merges][partial lse][partial o], each
// part 256-byte aligned. Offsets in bytes.
struct DecodeWorkspaceLayout {
  size_t items = 0, merges = 0, part_lse = 0, part_o = 0, total = 0;
};
DecodeWorkspaceLayout LayoutDecodeWorkspace(int64_t items, int64_t merges, int64_t slots, int heads,
                                            int dim);

// The workspace bytes that any plan of `in` (lengths up to in.max_seq_len) fits in, for outputs
// of `heads` x `dim`.
size_t DecodeWorkspaceBytes(const SplitPlanInput& in, int heads, int dim);

// PlanSplits within a given workspace: first lowers in->max_slots to the most partial results
// `workspace_bytes` holds, then plans and lays the plan out. Refused, with `who` and the sizes in
// the reason, when not even the unsplit plan fits or the plan's layout does not.
KernelStatus PlanSplitsInWorkspace(const char* who, SplitPlanInput* in, int heads, int dim,
                                   size_t workspace_bytes, SplitPlan* plan,
                                   DecodeWorkspaceLayout* layout);

// "chunk 2048, 32 split seqs (<= 2 splits), 128 items, one per block, merge": the plan in a line,
// for the benchmark's and the checks' notes.
std::string DescribePlan(const SplitPlan& plan);

}  // namespace kvpool::kernels
