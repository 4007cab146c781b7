#pragma once

// Paged grouped-query attention, decode step (one query token per sequence), straight over the
// engine's paged KV cache: bf16 or fp16 caches, or float8 e4m3 caches with per-tensor scales;
// head_dim 64, 128 or 256; any block size that is a multiple of 16; any layout PagedKvLayout
// describes. Long sequences are split across thread blocks (flash decoding) so that small
// batches still fill the GPU; the partial results are merged by a second kernel, or inside the
// attention kernel when each sequence's splits run as one thread block cluster.

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/types.h"

namespace kvpool::kernels {

// Bytes of workspace GqaDecode needs on the current device for this shape and types and any
// max_seq_len up to the one given (a few MiB at most; 256 bytes when nothing is split). 0 for
// a configuration GqaDecode does not cover. A smaller workspace also works, with fewer splits.
size_t GqaDecodeWorkspaceBytes(const GqaDecodeShape& shape, DType q_type, DType kv_type,
                               int max_seq_len);

// o[b, h, :] = v_scale * softmax_t(sm_scale * k_scale * q[b, h] . K[b, t]) V[b, t] over the
// first seq_lens[b] tokens, and lse[b, h] = ln sum_t exp(score_t) (pass null to skip it); as
// CpuGqaDecode. q_type is kBF16 or kFP16 and is also the type of o; kv_type is q_type or
// kFP8E4M3. kv_cache and every layout stride (in bytes) must be 16-byte aligned; q and o are
// contiguous. max_seq_len is a host-side bound on seq_lens. workspace: device memory of at least
// GqaDecodeWorkspaceBytes(shape, max_seq_len) bytes, used by one call at a time.
// cudaErrorInvalidValue for a configuration the kernels do not cover.
cudaError_t GqaDecode(const void* q, DType q_type,  // [batch, num_qo_heads, head_dim]
                      const void* kv_cache, DType kv_type, const PagedKvLayout& layout,
                      const int32_t* block_tables,  // [batch, max_blocks_per_seq]
                      const int32_t* seq_lens,      // [batch]
                      int max_seq_len, const GqaDecodeShape& shape, const AttentionScales& scales,
                      void* o,     // [batch, num_qo_heads, head_dim]
                      float* lse,  // [batch, num_qo_heads] or null
                      void* workspace, size_t workspace_bytes, cudaStream_t stream);

}  // namespace kvpool::kernels
