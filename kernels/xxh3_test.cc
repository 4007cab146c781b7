// kernels/xxh3.h's pieces, put together on the host as the GPU kernel puts them together
// (block sums in any order, then the per-lane scramble), against libxxhash's XXH3_64bits:
// every length up to 2 KiB (every short path and the first long shapes), random lengths up to
// 5 MiB at random alignments, and the block sizes the engine stores.

#include "kernels/xxh3.h"

#include <xxhash.h>

#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace kvpool::kernels {
namespace {

std::vector<uint8_t> RandomBytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> bytes(n);
  for (uint8_t& b : bytes) b = static_cast<uint8_t>(rng());
  return bytes;
}

TEST(Xxh3Test, EveryLengthUpTo2KiBMatchesLibxxhash) {
  const std::vector<uint8_t> bytes = RandomBytes(2048 + 16, 1);
  for (size_t len = 0; len <= 2048; ++len) {
    for (size_t offset : {0, 3}) {
      ASSERT_EQ(xxh3::Hash(bytes.data() + offset, len), XXH3_64bits(bytes.data() + offset, len))
          << "length " << len << " offset " << offset;
    }
  }
}

TEST(Xxh3Test, RandomLengthsAndBlockSizesMatchLibxxhash) {
  const std::vector<uint8_t> bytes = RandomBytes(size_t{5} << 20, 2);
  std::mt19937_64 rng(3);
  std::vector<size_t> lengths = {1024,      1025,          16 << 10,  (16 << 10) + 1,
                                 32 << 10,  72 << 10,      1 << 20,   2 << 20,
                                 (2 << 20) - 1, (2 << 20) + 63, 4 << 20};
  for (int i = 0; i < 100; ++i) lengths.push_back(rng() % (bytes.size() - 8));
  for (size_t len : lengths) {
    const size_t offset = rng() % 8;
    ASSERT_EQ(xxh3::Hash(bytes.data() + offset, len), XXH3_64bits(bytes.data() + offset, len))
        << "length " << len << " offset " << offset;
  }
}

TEST(Xxh3Test, OneFlippedBitChangesTheHash) {
  std::vector<uint8_t> bytes = RandomBytes(64 << 10, 4);
  const uint64_t before = xxh3::Hash(bytes.data(), bytes.size());
  bytes[12345] ^= 0x10;
  EXPECT_NE(xxh3::Hash(bytes.data(), bytes.size()), before);
  EXPECT_EQ(xxh3::Hash(bytes.data(), bytes.size()), XXH3_64bits(bytes.data(), bytes.size()));
}

}  // namespace
}  // namespace kvpool::kernels
