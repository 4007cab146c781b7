#pragma once

// CPU references of the kernels in this folder: the ground truth their GPU tests compare against.
// Plain C++, float32 arithmetic on the dequantized cache, no CUDA. Here the "device" addresses
// of a KvSegment and the cache pointers are ordinary host pointers. Not tuned; thread-compatible.

#include <cstdint>
#include <vector>

#include "kernels/types.h"

namespace kvpool::kernels {

// For each i < num_blocks and each segment s: copies segments[s].block_bytes bytes between
// segments[s].base + block_ids[i] * segments[s].block_stride and
// host_blocks[i] + segments[s].host_offset, in the given direction.
void CpuCopyBlocks(const KvSegment* segments, int num_segments,  // [num_segments]
                   const int32_t* block_ids,                     // [num_blocks]
                   uint8_t* const* host_blocks,                  // [num_blocks]
                   int num_blocks, CopyDirection direction);

// One decode step of grouped-query attention over a paged cache.
// Sequence b attends over its first seq_lens[b] tokens; token t of it lives in physical block
// block_tables[b * max_blocks_per_seq + t / block_size], slot t % block_size. seq_lens[b] may be
// 0 (output 0, lse -inf). lse is the natural log of sum_t exp(score_t).
void CpuGqaDecode(const void* q, DType q_type,  // [batch, num_qo_heads, head_dim]
                  const void* kv_cache, DType kv_type, const PagedKvLayout& layout,
                  const int32_t* block_tables,  // [batch, max_blocks_per_seq]
                  const int32_t* seq_lens,      // [batch]
                  const GqaDecodeShape& shape, const AttentionScales& scales,
                  float* o,     // [batch, num_qo_heads, head_dim]
                  float* lse);  // [batch, num_qo_heads]

// One decode step of MLA over a latent cache: every head attends with its 576-wide query to the
// shared token rows (keys: all 576 values; values: the first 512).
void CpuMlaDecode(const void* q, DType q_type,          // [batch, num_heads, 576]
                  const void* kv_cache, DType kv_type,  // [num_blocks, block_size, 576]
                  const int32_t* block_tables,          // [batch, max_blocks_per_seq]
                  const int32_t* seq_lens,              // [batch]
                  const MlaDecodeShape& shape, const AttentionScales& scales,
                  float* o,     // [batch, num_heads, 512]
                  float* lse);  // [batch, num_heads]

// Ragged lengths of the benchmark matrix and its checks: `batch` lengths drawn uniformly from
// [lo, hi] by a seeded generator (the same on every machine), the first one set to hi so that
// the longest sequence is always present.
std::vector<int32_t> SeededLengths(int batch, int lo, int hi, uint64_t seed);

}  // namespace kvpool::kernels
