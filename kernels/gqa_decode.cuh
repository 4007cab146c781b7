#pragma once

// Paged grouped-query attention, decode step (one query token per sequence), straight over the
// engine's paged KV cache: bf16 or fp16 caches, or float8 e4m3 caches with per-tensor scales;
// head_dim 64, 128 or 256; any block size that is a multiple of 16; any layout PagedKvLayout
// describes. Plan/run split: PlanGqaDecode sees the real lengths and cuts the batch into work
// items (long sequences split across thread blocks, flash decoding, short ones packed), and
// RunGqaDecode launches that plan; split sequences are merged by a second kernel.

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/decode_plan.h"
#include "kernels/types.h"

namespace kvpool::kernels {

// Benchmark and test overrides of the planner's choices; zero means "the planner decides". They
// travel inside the plan, so concurrent launches never see each other's settings.
struct GqaDecodeOptions {
  int warps = 0;         // (kv head, 8 or 16 query heads) pairs per block: 1, 2, 4 or 8
  int chunk = 0;         // tokens per work item (a multiple of 16) instead of the planned ones
  bool uniform = false;  // plan as if every sequence had max_seq_len (ignores host seq_lens)
  bool rows8 = false;    // groups above 8: 8 query heads per warp (two K/V streams per 16)
  int stages = 0;        // ring depth per warp: 4, or 3 (1-warp blocks, 16-bit caches, d <= 128;
                         // the default for those with 16 query heads per warp)
  bool plain_merge = false;  // launch the merge kernel after the attention kernel, not as its
                             // programmatic dependent (for comparison)
  int tile_warps = 0;  // warps per (kv head, query rows) pair, each taking every tile_warps-th
                       // tile of an item: 1, 2 or 4 (2 or 4 need blocks of one pair)
  bool spans = false;  // let the planner weigh equal spans per block (SplitPlanInput::spans)
  bool force_spans = false;  // take equal spans whenever they fit (for comparison)
};

// A launch plan: what PlanGqaDecode decided for one shape, types and set of lengths, with its
// work items already written into the workspace it was given. Keep it (and that workspace)
// for every GqaDecode call it serves, e.g. every layer of one decode step.
struct GqaDecodePlan {
  GqaDecodeShape shape;
  DType q_type = DType::kBF16;
  DType kv_type = DType::kBF16;
  int max_seq_len = 0;
  int warps = 0;        // pairs per block
  bool rows16 = false;  // 16 query heads per warp (groups above 8, head_dim <= 128)
  int stages = 4;       // ring depth per warp
  int tile_warps = 1;   // warps per pair, splitting each item's tiles
  bool plain_merge = false;
  SplitPlan split;      // items, merges, grid
  DecodeWorkspaceLayout layout;
  const void* workspace = nullptr;  // where the items were written
};

// Bytes of workspace any plan for this shape and types needs on the current device, for any
// lengths up to max_seq_len (a few MiB for typical shapes). 0 for a configuration GqaDecode does
// not cover (GqaDecodeSupported says why).
size_t GqaDecodeWorkspaceBytes(const GqaDecodeShape& shape, DType q_type, DType kv_type,
                               int max_seq_len, const GqaDecodeOptions& options = {});

// Ok, or why the kernels refuse this configuration.
KernelStatus GqaDecodeSupported(const GqaDecodeShape& shape, DType q_type, DType kv_type);

// Plans a launch: host_seq_lens (a host copy of the lengths, [batch]; null: every sequence at
// max_seq_len) lets the planner split long sequences and pack short ones so that every SM gets
// about the same work. Writes the items into `workspace` (device memory of
// GqaDecodeWorkspaceBytes bytes; a smaller one works with fewer splits) on `stream`.
KernelStatus PlanGqaDecode(const GqaDecodeShape& shape, DType q_type, DType kv_type,
                           const int32_t* host_seq_lens, int max_seq_len, void* workspace,
                           size_t workspace_bytes, cudaStream_t stream, GqaDecodePlan* plan,
                           const GqaDecodeOptions& options = {});

// Runs a plan: o[b, h, :] = v_scale * softmax_t(sm_scale * k_scale * q[b, h] . K[b, t]) V[b, t]
// over the first seq_lens[b] tokens, and lse[b, h] = ln sum_t exp(score_t) (null to skip); as
// CpuGqaDecode. q_type (kBF16 or kFP16) is also o's type; kv_type is q_type or kFP8E4M3.
// kv_cache and every layout stride (in bytes) must be 16-byte aligned; q and o are contiguous.
// seq_lens (device) must not exceed the plan's max_seq_len; lengths other than the planned ones
// are computed correctly, only balanced less well. One call at a time per workspace.
KernelStatus RunGqaDecode(const GqaDecodePlan& plan, const void* q,  // [batch, qo_heads, d]
                          const void* kv_cache, const PagedKvLayout& layout,
                          const int32_t* block_tables,  // [batch, max_blocks_per_seq]
                          const int32_t* seq_lens,      // [batch]
                          const AttentionScales& scales,
                          void* o,     // [batch, num_qo_heads, head_dim]
                          float* lse,  // [batch, num_qo_heads] or null
                          cudaStream_t stream);

// Plan (for every sequence at max_seq_len) and run in one call. cudaErrorInvalidValue for a
// configuration the kernels do not cover (PlanGqaDecode's status says why).
cudaError_t GqaDecode(const void* q, DType q_type,  // [batch, num_qo_heads, head_dim]
                      const void* kv_cache, DType kv_type, const PagedKvLayout& layout,
                      const int32_t* block_tables,  // [batch, max_blocks_per_seq]
                      const int32_t* seq_lens,      // [batch]
                      int max_seq_len, const GqaDecodeShape& shape, const AttentionScales& scales,
                      void* o,     // [batch, num_qo_heads, head_dim]
                      float* lse,  // [batch, num_qo_heads] or null
                      void* workspace, size_t workspace_bytes, cudaStream_t stream);

}  // namespace kvpool::kernels
