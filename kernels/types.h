#pragma once

// Plain descriptions of a paged KV cache and of block copies, shared by the CUDA launchers
// (`*.cuh`), their CPU references (`reference.h`) and the engine plugin. No CUDA types here, so
// code built without nvcc can use them.

#include <cstdint>

namespace kvpool::kernels {

// Element type of a cache or of queries and outputs.
enum class DType : uint8_t {
  kBF16,     // bfloat16
  kFP16,     // IEEE half
  kFP8E4M3,  // float8 e4m3 ("fn": no infinities, 0x7f/0xff are NaN); caches only, with a scale
};

inline int DTypeBytes(DType t) { return t == DType::kFP8E4M3 ? 1 : 2; }

// ---------------------------------------------------------------------------------------------
// Block copies

// One segment of a registered cache: a run of equally sized blocks in GPU memory. Block b of the
// segment occupies [base + b * block_stride, base + b * block_stride + block_bytes). When a block
// is stored in the pool, its bytes for this segment sit at host_offset inside the block's host
// object. A FlashAttention cache (2, num_blocks, block_size, heads, head_dim) gives two segments
// per layer (K and V); blocks-first caches (FlashInfer, MLA, packed K/V, cross-layer) give one.
struct KvSegment {
  uint64_t base = 0;          // device address of block 0
  uint64_t block_bytes = 0;   // bytes of one block in this segment
  uint64_t block_stride = 0;  // bytes from one block to the next (>= block_bytes)
  uint64_t host_offset = 0;   // where this segment's bytes start in a block's host object
};

enum class CopyDirection : uint8_t {
  kDeviceToHost,  // store: gather the blocks from the GPU cache into host objects
  kHostToDevice,  // load: scatter host objects into the GPU cache
};

// How the bytes move. kAuto picks per request (see block_copy.cuh).
enum class CopyMethod : uint8_t {
  kAuto,
  kKernel,      // one kernel whose threads load and store over PCIe (zero-copy)
  kCopyEngine,  // one cudaMemcpyBatchAsync entry per (block, segment) (copy engines)
  kStaged,      // a kernel packs/unpacks whole block objects in a device staging buffer, and
                // the copy engines move one contiguous object per block over PCIe
};

// ---------------------------------------------------------------------------------------------
// Paged attention caches

// Where K and V of (block, token-in-block, kv-head) live, in elements of the cache type. Rows of
// head_dim elements are contiguous. Covers every layout the engines use:
//   K/V-first  (2, num_blocks, block_size, kv_heads, d): KvFirst()
//   blocks-first (num_blocks, 2, block_size, kv_heads, d): BlocksFirst()
//   K/V packed in the last dimension (num_blocks, block_size, kv_heads, 2 * d): PackedLastDim()
//   heads before tokens (num_blocks, kv_heads, block_size, d): set the strides by hand.
struct PagedKvLayout {
  int64_t v_offset = 0;      // elements from K's row to the matching V row
  int64_t block_stride = 0;  // elements from block b to block b + 1
  int64_t token_stride = 0;  // elements from token t to t + 1 inside a block
  int64_t head_stride = 0;   // elements from kv head h to h + 1

  static PagedKvLayout KvFirst(int64_t num_blocks, int block_size, int kv_heads, int head_dim) {
    const int64_t block = int64_t{block_size} * kv_heads * head_dim;
    return {num_blocks * block, block, int64_t{kv_heads} * head_dim, head_dim};
  }
  static PagedKvLayout BlocksFirst(int block_size, int kv_heads, int head_dim) {
    const int64_t half = int64_t{block_size} * kv_heads * head_dim;
    return {half, 2 * half, int64_t{kv_heads} * head_dim, head_dim};
  }
  static PagedKvLayout PackedLastDim(int block_size, int kv_heads, int head_dim) {
    return {head_dim, int64_t{block_size} * kv_heads * 2 * head_dim,
            int64_t{kv_heads} * 2 * head_dim, 2 * int64_t{head_dim}};
  }
};

// Shapes of one GQA decode call: one query token per sequence.
struct GqaDecodeShape {
  int batch = 0;
  int num_qo_heads = 0;  // query head i reads kv head i / (num_qo_heads / num_kv_heads)
  int num_kv_heads = 0;
  int head_dim = 0;            // 64, 128 or 256
  int block_size = 0;          // tokens per cache block, a multiple of 16
  int max_blocks_per_seq = 0;  // row length of the block table
};

// Scales of one attention call. Scores are sm_scale * k_scale * (q . k); outputs are
// v_scale * sum(p * v). For bf16/fp16 caches k_scale and v_scale are normally 1.
struct AttentionScales {
  float sm_scale = 1.0f;
  float k_scale = 1.0f;
  float v_scale = 1.0f;
};

// MLA (DeepSeek) decode over a latent cache (num_blocks, block_size, 576): each token's row is
// 512 latent values followed by 64 rotary values; keys are the whole row, values its first 512.
inline constexpr int kMlaKDim = 576;
inline constexpr int kMlaVDim = 512;

struct MlaDecodeShape {
  int batch = 0;
  int num_heads = 0;   // 16 to 128, a multiple of 16
  int block_size = 0;  // tokens per cache block, a multiple of 32 (engines use 64)
  int max_blocks_per_seq = 0;
  int64_t block_stride = 0;  // elements from block b to b + 1 (block_size * 576 if dense)
};

}  // namespace kvpool::kernels
