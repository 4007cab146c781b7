// Tests of the CPU references (the ground truth of the GPU tests) against independent, naive
// float64 implementations over contiguous copies of the data, plus the dtype conversions.

#include "kernels/reference.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/dtype.h"

namespace kvpool::kernels {
namespace {

TEST(DTypeTest, BF16RoundsToNearestEven) {
  EXPECT_EQ(FloatToBF16(1.0f), 0x3f80);
  EXPECT_EQ(FloatToBF16(-2.0f), 0xc000);
  EXPECT_EQ(FloatToBF16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);      // tie -> even
  EXPECT_EQ(FloatToBF16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);  // tie -> even (up)
  EXPECT_EQ(FloatToBF16(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -12)), 0x3f81);
  EXPECT_TRUE(std::isnan(BF16ToFloat(FloatToBF16(NAN))));
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = BF16ToFloat(static_cast<uint16_t>(h));
    if (!std::isnan(f)) {
      EXPECT_EQ(FloatToBF16(f), h);
    }
  }
}

TEST(DTypeTest, FP16RoundTripsAndRounds) {
  EXPECT_EQ(FloatToFP16(1.0f), 0x3c00);
  EXPECT_EQ(FloatToFP16(65504.0f), 0x7bff);
  EXPECT_EQ(FloatToFP16(65520.0f), 0x7c00);
  EXPECT_EQ(FloatToFP16(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(FloatToFP16(1e-9f), 0x0000);
  EXPECT_EQ(FloatToFP16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // tie -> even
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = FP16ToFloat(static_cast<uint16_t>(h));
    if (!std::isnan(f)) {
      EXPECT_EQ(FloatToFP16(f), h) << h;
    }
  }
}

TEST(DTypeTest, FP8E4M3DecodesAndEncodes) {
  EXPECT_EQ(FP8E4M3ToFloat(0x38), 1.0f);
  EXPECT_EQ(FP8E4M3ToFloat(0x7e), 448.0f);
  EXPECT_EQ(FP8E4M3ToFloat(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(FP8E4M3ToFloat(0xb8), -1.0f);
  EXPECT_TRUE(std::isnan(FP8E4M3ToFloat(0x7f)));
  EXPECT_TRUE(std::isnan(FP8E4M3ToFloat(0xff)));
  EXPECT_EQ(FloatToFP8E4M3(1000.0f), 0x7e);  // saturates
  EXPECT_EQ(FloatToFP8E4M3(1.0625f), 0x38);  // tie between 1 and 1.125 -> even
  for (int b = 0; b < 256; ++b) {
    const float f = FP8E4M3ToFloat(static_cast<uint8_t>(b));
    if (!std::isnan(f)) {
      EXPECT_EQ(FloatToFP8E4M3(f), b) << b;
    }
  }
}

TEST(CpuCopyBlocksTest, GatherThenScatterRoundTrips) {
  std::mt19937_64 rng(7);
  const int num_blocks = 20, layers = 3;
  // FlashAttention-like: per layer K and V segments of 96-byte blocks, plus one strided
  // segment with an odd length.
  std::vector<uint8_t> cache(layers * 2 * num_blocks * 96 + num_blocks * 64);
  for (auto& b : cache) b = static_cast<uint8_t>(rng());
  std::vector<KvSegment> segs;
  uint64_t off = 0;
  for (int l = 0; l < layers; ++l) {
    for (int kv = 0; kv < 2; ++kv) {
      const uint64_t base = (l * 2 + kv) * num_blocks * 96;
      segs.push_back({reinterpret_cast<uint64_t>(cache.data()) + base, 96, 96, off});
      off += 96;
    }
  }
  segs.push_back(
      {reinterpret_cast<uint64_t>(cache.data()) + layers * 2 * num_blocks * 96, 37, 64, off});
  off += 37;
  const std::vector<int32_t> ids = {5, 0, 19, 7, 8};
  std::vector<std::vector<uint8_t>> objects(ids.size(), std::vector<uint8_t>(off));
  std::vector<uint8_t*> ptrs;
  for (auto& o : objects) ptrs.push_back(o.data());
  CpuCopyBlocks(segs.data(), static_cast<int>(segs.size()), ids.data(), ptrs.data(),
                static_cast<int>(ids.size()), CopyDirection::kDeviceToHost);
  for (size_t i = 0; i < ids.size(); ++i) {
    for (const KvSegment& s : segs) {
      const auto* src = reinterpret_cast<const uint8_t*>(s.base) + ids[i] * s.block_stride;
      EXPECT_EQ(std::memcmp(objects[i].data() + s.host_offset, src, s.block_bytes), 0);
    }
  }
  const std::vector<uint8_t> before = cache;
  std::vector<uint8_t> scratch(cache.size(), 0);
  // Scatter into a zeroed copy, then the touched bytes equal the original.
  std::vector<KvSegment> segs2 = segs;
  for (auto& s : segs2)
    s.base = s.base - reinterpret_cast<uint64_t>(cache.data()) +
             reinterpret_cast<uint64_t>(scratch.data());
  CpuCopyBlocks(segs2.data(), static_cast<int>(segs2.size()), ids.data(), ptrs.data(),
                static_cast<int>(ids.size()), CopyDirection::kHostToDevice);
  for (size_t i = 0; i < ids.size(); ++i) {
    for (size_t k = 0; k < segs.size(); ++k) {
      const uint64_t at =
          segs[k].base - reinterpret_cast<uint64_t>(cache.data()) + ids[i] * segs[k].block_stride;
      EXPECT_EQ(std::memcmp(scratch.data() + at, before.data() + at, segs[k].block_bytes), 0);
    }
  }
}

// Naive attention in double over contiguous rows.
void NaiveAttention(const std::vector<double>& q, const std::vector<std::vector<double>>& keys,
                    const std::vector<std::vector<double>>& values, int v_dim, double scale,
                    double v_scale, std::vector<double>* o, double* lse) {
  const size_t n = keys.size();
  o->assign(v_dim, 0.0);
  if (n == 0) {
    *lse = -INFINITY;
    return;
  }
  std::vector<double> s(n);
  double m = -INFINITY;
  for (size_t t = 0; t < n; ++t) {
    s[t] = scale * std::inner_product(q.begin(), q.end(), keys[t].begin(), 0.0);
    m = std::max(m, s[t]);
  }
  double l = 0.0;
  for (size_t t = 0; t < n; ++t) {
    const double p = std::exp(s[t] - m);
    l += p;
    for (size_t d = 0; d < o->size(); ++d) (*o)[d] += p * values[t][d];
  }
  for (double& v : *o) v *= v_scale / l;
  *lse = m + std::log(l);
}

void FillNaN(std::vector<uint8_t>* cache, DType t) {
  if (t == DType::kFP8E4M3) {
    std::fill(cache->begin(), cache->end(), 0x7f);
    return;
  }
  const uint16_t nan = t == DType::kBF16 ? 0x7fc0 : 0x7e00;
  for (size_t i = 0; i + 1 < cache->size(); i += 2) std::memcpy(cache->data() + i, &nan, 2);
}

struct GqaParam {
  DType kv_type;
  DType q_type;
  int qo_heads, kv_heads, head_dim, block_size;
};

class CpuGqaDecodeTest : public ::testing::TestWithParam<GqaParam> {};

TEST_P(CpuGqaDecodeTest, MatchesNaiveOnEveryLayout) {
  const GqaParam p = GetParam();
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  const std::vector<int> lens = {1, p.block_size, 2 * p.block_size + 3, 0, 45};
  const int batch = static_cast<int>(lens.size());
  const int d = p.head_dim, bs = p.block_size, kvh = p.kv_heads;
  // Logical K/V per (b, t, head), already rounded to the cache type.
  std::vector<std::vector<std::vector<double>>> k(batch), v(batch);  // [b][t * kvh + h][d]
  for (int b = 0; b < batch; ++b) {
    for (int t = 0; t < lens[b] * kvh; ++t) {
      std::vector<double> kr(d), vr(d);
      for (int j = 0; j < d; ++j) {
        uint8_t buf[2];
        StoreFromFloat(buf, 0, p.kv_type, unit(rng) * 2.0f);
        kr[j] = LoadAsFloat(buf, 0, p.kv_type);
        StoreFromFloat(buf, 0, p.kv_type, unit(rng) * 2.0f);
        vr[j] = LoadAsFloat(buf, 0, p.kv_type);
      }
      k[b].push_back(kr);
      v[b].push_back(vr);
    }
  }
  std::vector<uint8_t> q(size_t{2} * batch * p.qo_heads * d);
  for (size_t i = 0; i < q.size() / 2; ++i) StoreFromFloat(q.data(), i, p.q_type, unit(rng));
  // Block table: blocks handed out in reverse order, unused entries point at block 0.
  int max_blocks = 0, total = 0;
  for (int len : lens) {
    max_blocks = std::max(max_blocks, (len + bs - 1) / bs);
    total += (len + bs - 1) / bs;
  }
  const int num_blocks = total + 2;
  std::vector<int32_t> table(batch * max_blocks, num_blocks - 1);
  int next = num_blocks - 2;
  for (int b = 0; b < batch; ++b) {
    for (int j = 0; j < (lens[b] + bs - 1) / bs; ++j) table[b * max_blocks + j] = next--;
  }
  const AttentionScales scales{0.3f, 0.5f, 2.0f};
  const GqaDecodeShape shape{batch, p.qo_heads, kvh, d, bs, max_blocks};
  const PagedKvLayout layouts[] = {
      PagedKvLayout::KvFirst(num_blocks, bs, kvh, d), PagedKvLayout::BlocksFirst(bs, kvh, d),
      PagedKvLayout::PackedLastDim(bs, kvh, d),
      PagedKvLayout{int64_t{kvh} * bs * d, 2 * int64_t{kvh} * bs * d, d, int64_t{bs} * d}};
  std::vector<float> first_o;
  for (const PagedKvLayout& layout : layouts) {
    const int eb = DTypeBytes(p.kv_type);
    std::vector<uint8_t> cache(size_t{2} * num_blocks * bs * kvh * d * eb);
    FillNaN(&cache, p.kv_type);  // unused slots must never be read
    for (int b = 0; b < batch; ++b) {
      for (int t = 0; t < lens[b]; ++t) {
        for (int h = 0; h < kvh; ++h) {
          const int64_t row = int64_t{table[b * max_blocks + t / bs]} * layout.block_stride +
                              (t % bs) * layout.token_stride + h * layout.head_stride;
          for (int j = 0; j < d; ++j) {
            StoreFromFloat(cache.data(), row + j, p.kv_type,
                           static_cast<float>(k[b][t * kvh + h][j]));
            StoreFromFloat(cache.data(), row + layout.v_offset + j, p.kv_type,
                           static_cast<float>(v[b][t * kvh + h][j]));
          }
        }
      }
    }
    std::vector<float> o(size_t{1} * batch * p.qo_heads * d), lse(batch * p.qo_heads);
    CpuGqaDecode(q.data(), p.q_type, cache.data(), p.kv_type, layout, table.data(), lens.data(),
                 shape, scales, o.data(), lse.data());
    if (first_o.empty()) {
      first_o = o;
    } else {
      EXPECT_EQ(o, first_o) << "layouts must give identical results";
    }
    const int group = p.qo_heads / kvh;
    for (int b = 0; b < batch; ++b) {
      for (int h = 0; h < p.qo_heads; ++h) {
        std::vector<double> qd(d);
        for (int j = 0; j < d; ++j) {
          qd[j] = LoadAsFloat(q.data(), (int64_t{b} * p.qo_heads + h) * d + j, p.q_type);
        }
        std::vector<std::vector<double>> keys, values;
        for (int t = 0; t < lens[b]; ++t) {
          keys.push_back(k[b][t * kvh + h / group]);
          values.push_back(v[b][t * kvh + h / group]);
        }
        std::vector<double> want;
        double want_lse;
        NaiveAttention(qd, keys, values, d, scales.sm_scale * scales.k_scale, scales.v_scale, &want,
                       &want_lse);
        const float* got = o.data() + (int64_t{b} * p.qo_heads + h) * d;
        for (int j = 0; j < d; ++j) {
          ASSERT_NEAR(got[j], want[j], 1e-4 * (1.0 + std::fabs(want[j])))
              << b << " " << h << " " << j;
        }
        const float got_lse = lse[b * p.qo_heads + h];
        if (lens[b] == 0) {
          EXPECT_TRUE(std::isinf(got_lse) && got_lse < 0);
        } else {
          EXPECT_NEAR(got_lse, want_lse, 1e-4 * (1.0 + std::fabs(want_lse)));
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, CpuGqaDecodeTest,
                         ::testing::Values(GqaParam{DType::kBF16, DType::kBF16, 32, 8, 64, 16},
                                           GqaParam{DType::kFP16, DType::kFP16, 8, 2, 128, 32},
                                           GqaParam{DType::kFP8E4M3, DType::kBF16, 16, 8, 64, 64},
                                           GqaParam{DType::kFP8E4M3, DType::kFP16, 4, 4, 256, 16}));

TEST(CpuMlaDecodeTest, MatchesNaive) {
  for (DType kv_type : {DType::kBF16, DType::kFP8E4M3}) {
    std::mt19937_64 rng(13);
    std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
    const std::vector<int> lens = {1, 64, 100, 0};
    const int batch = 4, heads = 16, bs = 32;
    const int64_t block_stride = bs * kMlaKDim + 16;  // padded blocks
    int max_blocks = 0, total = 0;
    for (int len : lens) {
      max_blocks = std::max(max_blocks, (len + bs - 1) / bs);
      total += (len + bs - 1) / bs;
    }
    const int num_blocks = total + 1;
    std::vector<int32_t> ids(total);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    std::vector<int32_t> table(batch * max_blocks, total);  // unused entries: a NaN block
    int next = 0;
    for (int b = 0; b < batch; ++b) {
      for (int j = 0; j < (lens[b] + bs - 1) / bs; ++j) table[b * max_blocks + j] = ids[next++];
    }
    const int eb = DTypeBytes(kv_type);
    std::vector<uint8_t> cache(num_blocks * block_stride * eb);
    FillNaN(&cache, kv_type);
    std::vector<std::vector<std::vector<double>>> rows(batch);
    for (int b = 0; b < batch; ++b) {
      for (int t = 0; t < lens[b]; ++t) {
        std::vector<double> row(kMlaKDim);
        const int64_t at = table[b * max_blocks + t / bs] * block_stride + (t % bs) * kMlaKDim;
        for (int j = 0; j < kMlaKDim; ++j) {
          StoreFromFloat(cache.data(), at + j, kv_type, unit(rng));
          row[j] = LoadAsFloat(cache.data(), at + j, kv_type);
        }
        rows[b].push_back(row);
      }
    }
    std::vector<uint8_t> q(size_t{2} * batch * heads * kMlaKDim);
    for (size_t i = 0; i < q.size() / 2; ++i) StoreFromFloat(q.data(), i, DType::kBF16, unit(rng));
    const MlaDecodeShape shape{batch, heads, bs, max_blocks, block_stride};
    const AttentionScales scales{0.07f, 0.5f, 0.5f};
    std::vector<float> o(size_t{1} * batch * heads * kMlaVDim), lse(batch * heads);
    CpuMlaDecode(q.data(), DType::kBF16, cache.data(), kv_type, table.data(), lens.data(), shape,
                 scales, o.data(), lse.data());
    for (int b = 0; b < batch; ++b) {
      for (int h = 0; h < heads; ++h) {
        std::vector<double> qd(kMlaKDim);
        for (int j = 0; j < kMlaKDim; ++j) {
          qd[j] = LoadAsFloat(q.data(), (int64_t{b} * heads + h) * kMlaKDim + j, DType::kBF16);
        }
        std::vector<std::vector<double>> values;
        for (const auto& r : rows[b]) values.emplace_back(r.begin(), r.begin() + kMlaVDim);
        std::vector<double> want;
        double want_lse;
        NaiveAttention(qd, rows[b], values, kMlaVDim, scales.sm_scale * scales.k_scale,
                       scales.v_scale, &want, &want_lse);
        const float* got = o.data() + (int64_t{b} * heads + h) * kMlaVDim;
        for (int j = 0; j < kMlaVDim; ++j) {
          ASSERT_NEAR(got[j], want[j], 1e-4 * (1.0 + std::fabs(want[j])));
        }
        if (lens[b] > 0) {
          EXPECT_NEAR(lse[b * heads + h], want_lse, 1e-4 * (1 + std::fabs(want_lse)));
        }
      }
    }
  }
}

}  // namespace
}  // namespace kvpool::kernels
