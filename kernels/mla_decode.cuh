#pragma once

// MLA (multi-head latent attention, DeepSeek V2/V3) decode over a paged latent cache
// (num_blocks, block_size, 576): 512 latent values then 64 rotary values per token, shared by
// all heads. Keys are whole rows, values their first 512 entries. bf16, fp16 or float8 e4m3
// (with a scale) caches; 16 to 128 query heads (a multiple of 16); any block size.

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/types.h"

namespace kvpool::kernels {

// Bytes of workspace MlaDecode needs on the current device for this shape and types and
// max_seq_len (a few MiB at most; a smaller workspace also works, with fewer splits). 0 for a
// configuration MlaDecode does not cover.
size_t MlaDecodeWorkspaceBytes(const MlaDecodeShape& shape, DType q_type, DType kv_type,
                               int max_seq_len);

// o[b, h, :] = v_scale * softmax_t(sm_scale * k_scale * q[b, h] . c[b, t]) c[b, t, :512] over
// the first seq_lens[b] tokens; lse[b, h] = ln sum_t exp(score_t) (null to skip); as
// CpuMlaDecode. q_type (kBF16 or kFP16) is also o's type; kv_type is q_type or kFP8E4M3. q, o and
// kv_cache are 16-byte aligned, shape.block_stride (elements) keeps every block 16-byte
// aligned. max_seq_len bounds seq_lens on the host. workspace: device memory of at least
// MlaDecodeWorkspaceBytes(shape, max_seq_len) bytes, used by one call at a time.
cudaError_t MlaDecode(const void* q, DType q_type,          // [batch, num_heads, 576]
                      const void* kv_cache, DType kv_type,  // [num_blocks, block_size, 576]
                      const int32_t* block_tables,          // [batch, max_blocks_per_seq]
                      const int32_t* seq_lens,              // [batch]
                      int max_seq_len, const MlaDecodeShape& shape, const AttentionScales& scales,
                      void* o,     // [batch, num_heads, 512]
                      float* lse,  // [batch, num_heads] or null
                      void* workspace, size_t workspace_bytes, cudaStream_t stream);

}  // namespace kvpool::kernels
