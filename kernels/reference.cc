#include "kernels/reference.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/dtype.h"

namespace kvpool::kernels {

void CpuCopyBlocks(const KvSegment* segments, int num_segments, const int32_t* block_ids,
                   uint8_t* const* host_blocks, int num_blocks, CopyDirection direction) {
  for (int i = 0; i < num_blocks; ++i) {
    for (int s = 0; s < num_segments; ++s) {
      const KvSegment& seg = segments[s];
      auto* dev = reinterpret_cast<uint8_t*>(seg.base) + int64_t{block_ids[i]} * seg.block_stride;
      uint8_t* host = host_blocks[i] + seg.host_offset;
      if (direction == CopyDirection::kDeviceToHost) {
        std::memcpy(host, dev, seg.block_bytes);
      } else {
        std::memcpy(dev, host, seg.block_bytes);
      }
    }
  }
}

namespace {

// Softmax attention of one query row over rows [0, n) given by key(t) and value(t) pointers;
// the cache values are dequantized to float first.
template <typename KeyAt, typename ValueAt>
void AttendOne(const float* q, int k_dim, int v_dim, int n, float score_scale, float v_scale,
               DType kv_type, KeyAt key_at, ValueAt value_at, float* o, float* lse) {
  if (n == 0) {
    for (int d = 0; d < v_dim; ++d) o[d] = 0.0f;
    *lse = -std::numeric_limits<float>::infinity();
    return;
  }
  std::vector<float> s(n);
  float m = -std::numeric_limits<float>::infinity();
  for (int t = 0; t < n; ++t) {
    const void* k = key_at(t);
    float acc = 0.0f;
    for (int d = 0; d < k_dim; ++d) acc += q[d] * LoadAsFloat(k, d, kv_type);
    s[t] = acc * score_scale;
    m = std::max(m, s[t]);
  }
  float l = 0.0f;
  std::vector<float> acc(v_dim, 0.0f);
  for (int t = 0; t < n; ++t) {
    const float p = std::exp(s[t] - m);
    l += p;
    const void* v = value_at(t);
    for (int d = 0; d < v_dim; ++d) acc[d] += p * LoadAsFloat(v, d, kv_type);
  }
  for (int d = 0; d < v_dim; ++d) o[d] = acc[d] * v_scale / l;
  *lse = m + std::log(l);
}

}  // namespace

void CpuGqaDecode(const void* q, DType q_type, const void* kv_cache, DType kv_type,
                  const PagedKvLayout& layout, const int32_t* block_tables, const int32_t* seq_lens,
                  const GqaDecodeShape& shape, const AttentionScales& scales, float* o,
                  float* lse) {
  const int d = shape.head_dim;
  const int group = shape.num_qo_heads / shape.num_kv_heads;
  const int elt = DTypeBytes(kv_type);
  const auto* cache = static_cast<const uint8_t*>(kv_cache);
  std::vector<float> qf(d);
  for (int b = 0; b < shape.batch; ++b) {
    const int32_t* table = block_tables + int64_t{b} * shape.max_blocks_per_seq;
    for (int h = 0; h < shape.num_qo_heads; ++h) {
      const int kvh = h / group;
      const int64_t qi = (int64_t{b} * shape.num_qo_heads + h) * d;
      for (int j = 0; j < d; ++j) qf[j] = LoadAsFloat(q, qi + j, q_type);
      auto row = [&](int t) {
        return int64_t{table[t / shape.block_size]} * layout.block_stride +
               int64_t{t % shape.block_size} * layout.token_stride +
               int64_t{kvh} * layout.head_stride;
      };
      auto key_at = [&](int t) -> const void* { return cache + row(t) * elt; };
      auto value_at = [&](int t) -> const void* {
        return cache + (row(t) + layout.v_offset) * elt;
      };
      AttendOne(qf.data(), d, d, seq_lens[b], scales.sm_scale * scales.k_scale, scales.v_scale,
                kv_type, key_at, value_at, o + qi, lse + int64_t{b} * shape.num_qo_heads + h);
    }
  }
}

void CpuMlaDecode(const void* q, DType q_type, const void* kv_cache, DType kv_type,
                  const int32_t* block_tables, const int32_t* seq_lens, const MlaDecodeShape& shape,
                  const AttentionScales& scales, float* o, float* lse) {
  const int elt = DTypeBytes(kv_type);
  const auto* cache = static_cast<const uint8_t*>(kv_cache);
  std::vector<float> qf(kMlaKDim);
  for (int b = 0; b < shape.batch; ++b) {
    const int32_t* table = block_tables + int64_t{b} * shape.max_blocks_per_seq;
    auto row_at = [&](int t) -> const void* {
      return cache + (int64_t{table[t / shape.block_size]} * shape.block_stride +
                      int64_t{t % shape.block_size} * kMlaKDim) *
                         elt;
    };
    for (int h = 0; h < shape.num_heads; ++h) {
      const int64_t bh = int64_t{b} * shape.num_heads + h;
      for (int j = 0; j < kMlaKDim; ++j) qf[j] = LoadAsFloat(q, bh * kMlaKDim + j, q_type);
      AttendOne(qf.data(), kMlaKDim, kMlaVDim, seq_lens[b], scales.sm_scale * scales.k_scale,
                scales.v_scale, kv_type, row_at, row_at, o + bh * kMlaVDim, lse + bh);
    }
  }
}

std::vector<int32_t> SeededLengths(int batch, int lo, int hi, uint64_t seed) {
  std::vector<int32_t> lens(std::max(batch, 0));
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;  // splitmix64: fixed across standard libraries
  for (int32_t& len : lens) {
    x += 0x9E3779B97F4A7C15ull;
    uint64_t z = x;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    len = lo + static_cast<int32_t>(z % static_cast<uint64_t>(hi - lo + 1));
  }
  if (!lens.empty()) lens[0] = hi;
  return lens;
}

}  // namespace kvpool::kernels
