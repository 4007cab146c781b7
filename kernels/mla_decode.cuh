#pragma once

// MLA (multi-head latent attention, DeepSeek V2/V3) decode over a paged latent cache
// (num_blocks, block_size, 576): 512 latent values then 64 rotary values per token, shared by
// all heads. Keys are whole rows, values their first 512 entries. bf16, fp16 or float8 e4m3
// (with a scale) caches; 16 to 128 query heads (a multiple of 16); any block size.

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/decode_plan.h"
#include "kernels/types.h"

namespace kvpool::kernels {

// Benchmark and test overrides of the planner's choices; zero means "the planner decides". They
// travel inside the plan, so concurrent launches never see each other's settings.
struct MlaDecodeOptions {
  int heads_per_block = 0;  // 16, 32 (mma.sync) or 64 (wgmma: 16-bit caches, tensor copies,
                            // sm_90a); default: 64 where that kernel runs and divides num_heads,
                            // else 32, else 16
  bool row_copies = false;  // one bulk copy per row instead of tensor copies (TMA)
  int chunk = 0;            // tokens per work item (a multiple of 64) instead of the planned ones
  bool uniform = false;     // plan as if every sequence had max_seq_len (ignores host seq_lens)
  bool plain_merge = false;  // launch the merge kernel after the attention kernel, not as its
                             // programmatic dependent (for comparison)
  bool no_spans = false;     // plan per sequence only, never equal spans per block (for
                             // comparison; SplitPlanInput::spans)
  bool force_spans = false;  // take equal spans whenever they fit (for comparison)
  // The wgmma kernel moves a row's running max only when a tile's exceeds it by more than 8
  // (log2), so that most tiles skip O's rescale; eager_rescale moves it at every new maximum
  // (for comparison).
  bool eager_rescale = false;
};

// A launch plan (see GqaDecodePlan): items already written into the workspace it was given.
struct MlaDecodePlan {
  MlaDecodeShape shape;
  DType q_type = DType::kBF16;
  DType kv_type = DType::kBF16;
  int max_seq_len = 0;
  int heads_per_block = 0;
  bool tma = false;  // tensor copies
  bool lazy_rescale = false;  // the wgmma kernel's running max moves only by more than 8
  bool plain_merge = false;
  SplitPlan split;
  DecodeWorkspaceLayout layout;
  const void* workspace = nullptr;
};

// Bytes of workspace any plan for this shape and types needs on the current device for lengths
// up to max_seq_len (a smaller workspace also works, with fewer splits). 0 for a configuration
// MlaDecode does not cover (MlaDecodeSupported says why).
size_t MlaDecodeWorkspaceBytes(const MlaDecodeShape& shape, DType q_type, DType kv_type,
                               int max_seq_len, const MlaDecodeOptions& options = {});

// Ok, or why the kernels refuse this configuration.
KernelStatus MlaDecodeSupported(const MlaDecodeShape& shape, DType q_type, DType kv_type);

// Plans a launch from a host copy of the lengths (null: every sequence at max_seq_len) and
// writes its items into `workspace` on `stream`.
KernelStatus PlanMlaDecode(const MlaDecodeShape& shape, DType q_type, DType kv_type,
                           const int32_t* host_seq_lens, int max_seq_len, void* workspace,
                           size_t workspace_bytes, cudaStream_t stream, MlaDecodePlan* plan,
                           const MlaDecodeOptions& options = {});

// Runs a plan: o[b, h, :] = v_scale * softmax_t(sm_scale * k_scale * q[b, h] . c[b, t])
// c[b, t, :512] over the first seq_lens[b] tokens; lse[b, h] = ln sum_t exp(score_t) (null to
// skip); as CpuMlaDecode. q, o and kv_cache are 16-byte aligned. seq_lens (device) must not
// exceed the plan's max_seq_len. One call at a time per workspace.
KernelStatus RunMlaDecode(const MlaDecodePlan& plan, const void* q,  // [batch, num_heads, 576]
                          const void* kv_cache,         // [num_blocks, block_size, 576]
                          const int32_t* block_tables,  // [batch, max_blocks_per_seq]
                          const int32_t* seq_lens,      // [batch]
                          const AttentionScales& scales,
                          void* o,     // [batch, num_heads, 512]
                          float* lse,  // [batch, num_heads] or null
                          cudaStream_t stream);

// Plan (for every sequence at max_seq_len) and run in one call; cudaErrorInvalidValue for a
// configuration the kernels do not cover (PlanMlaDecode's status says why).
cudaError_t MlaDecode(const void* q, DType q_type,          // [batch, num_heads, 576]
                      const void* kv_cache, DType kv_type,  // [num_blocks, block_size, 576]
                      const int32_t* block_tables,          // [batch, max_blocks_per_seq]
                      const int32_t* seq_lens,              // [batch]
                      int max_seq_len, const MlaDecodeShape& shape, const AttentionScales& scales,
                      void* o,     // [batch, num_heads, 512]
                      float* lse,  // [batch, num_heads] or null
                      void* workspace, size_t workspace_bytes, cudaStream_t stream);

}  // namespace kvpool::kernels
