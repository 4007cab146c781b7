#pragma once

// XXH3-64 (seed 0, the default secret: what XXH3_64bits computes, and what the store records as
// an object's checksum, proto/checksum.h), written as pieces that the GPU's checksum kernel
// (checksum.cuh) and the host share. Plain C++ with __host__ __device__ under nvcc.
//
// Inputs of at most 240 bytes use XXH3's short paths (ShortHash). Longer inputs run XXH3's long
// loop, which this file splits so that it parallelises: an input is 1 KiB blocks of 16 stripes
// of 64 bytes; within a block each stripe only adds to the 8 accumulator lanes, so a block's
// effect is one sum per lane (StripeAdd over its stripes, in any order), and the lanes then go
// through Scramble, block after block, each lane on its own. LongHash below does exactly that on
// the host; the kernel sums the stripes of many blocks at once and scrambles in order.

#include <cstddef>
#include <cstdint>

#if defined(__CUDACC__)
#define KVPOOL_XXH3_FN __host__ __device__ __forceinline__
#else
#define KVPOOL_XXH3_FN inline
#endif

namespace kvpool::kernels::xxh3 {

inline constexpr uint64_t kStripeBytes = 64;
inline constexpr uint64_t kBlockBytes = 1024;  // 16 stripes, one scramble
inline constexpr int kStripesPerBlock = 16;
inline constexpr uint64_t kMaxShortBytes = 240;
inline constexpr int kSecretBytes = 192;
inline constexpr int kSecretWords = kSecretBytes / 8;
// The secret of the last stripe starts here (not 8-aligned), the merge's at kMergeSecret.
inline constexpr int kLastStripeSecret = kSecretBytes - 64 - 7;
inline constexpr int kMergeSecret = 11;
inline constexpr int kScrambleSecret = kSecretBytes - 64;

inline constexpr uint64_t kPrime32_1 = 0x9E3779B1U;
inline constexpr uint64_t kPrime32_2 = 0x85EBCA77U;
inline constexpr uint64_t kPrime32_3 = 0xC2B2AE3DU;
inline constexpr uint64_t kPrime64_1 = 0x9E3779B185EBCA87ULL;
inline constexpr uint64_t kPrime64_2 = 0xC2B2AE3D27D4EB4FULL;
inline constexpr uint64_t kPrime64_3 = 0x165667B19E3779F9ULL;
inline constexpr uint64_t kPrime64_4 = 0x85EBCA77C2B2AE63ULL;
inline constexpr uint64_t kPrime64_5 = 0x27D4EB2F165667C5ULL;

// XXH3's default secret (XXH3_kSecret), the 192 bytes every unseeded XXH3 hash uses.
struct Secret {
  uint8_t bytes[kSecretBytes];
};
inline constexpr Secret kDefaultSecret = {{
    0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81, 0x2c, 0xf7, 0x21, 0xad, 0x1c,
    0xde, 0xd4, 0x6d, 0xe9, 0x83, 0x90, 0x97, 0xdb, 0x72, 0x40, 0xa4, 0xa4, 0xb7, 0xb3, 0x67, 0x1f,
    0xcb, 0x79, 0xe6, 0x4e, 0xcc, 0xc0, 0xe5, 0x78, 0x82, 0x5a, 0xd0, 0x7d, 0xcc, 0xff, 0x72, 0x21,
    0xb8, 0x08, 0x46, 0x74, 0xf7, 0x43, 0x24, 0x8e, 0xe0, 0x35, 0x90, 0xe6, 0x81, 0x3a, 0x26, 0x4c,
    0x3c, 0x28, 0x52, 0xbb, 0x91, 0xc3, 0x00, 0xcb, 0x88, 0xd0, 0x65, 0x8b, 0x1b, 0x53, 0x2e, 0xa3,
    0x71, 0x64, 0x48, 0x97, 0xa2, 0x0d, 0xf9, 0x4e, 0x38, 0x19, 0xef, 0x46, 0xa9, 0xde, 0xac, 0xd8,
    0xa8, 0xfa, 0x76, 0x3f, 0xe3, 0x9c, 0x34, 0x3f, 0xf9, 0xdc, 0xbb, 0xc7, 0xc7, 0x0b, 0x4f, 0x1d,
    0x8a, 0x51, 0xe0, 0x4b, 0xcd, 0xb4, 0x59, 0x31, 0xc8, 0x9f, 0x7e, 0xc9, 0xd9, 0x78, 0x73, 0x64,
    0xea, 0xc5, 0xac, 0x83, 0x34, 0xd3, 0xeb, 0xc3, 0xc5, 0x81, 0xa0, 0xff, 0xfa, 0x13, 0x63, 0xeb,
    0x17, 0x0d, 0xdd, 0x51, 0xb7, 0xf0, 0xda, 0x49, 0xd3, 0x16, 0x55, 0x26, 0x29, 0xd4, 0x68, 0x9e,
    0x2b, 0x16, 0xbe, 0x58, 0x7d, 0x47, 0xa1, 0xfc, 0x8f, 0xf8, 0xb8, 0xd1, 0x7a, 0xd0, 0x31, 0xce,
    0x45, 0xcb, 0x3a, 0x8f, 0x95, 0x16, 0x04, 0x28, 0xaf, 0xd7, 0xfb, 0xca, 0xbb, 0x4b, 0x40, 0x7e,
}};

KVPOOL_XXH3_FN uint32_t Read32(const uint8_t* p) {
  return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
}
KVPOOL_XXH3_FN uint64_t Read64(const uint8_t* p) {
  return uint64_t{Read32(p)} | uint64_t{Read32(p + 4)} << 32;
}
KVPOOL_XXH3_FN uint64_t Rotl64(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
KVPOOL_XXH3_FN uint64_t Swap64(uint64_t x) {
  uint64_t y = 0;
  for (int i = 0; i < 8; ++i) y |= ((x >> (8 * i)) & 0xff) << (8 * (7 - i));
  return y;
}

// Low 64 bits of the 128-bit product, xor its high 64 bits.
KVPOOL_XXH3_FN uint64_t Mul128Fold64(uint64_t a, uint64_t b) {
#if defined(__CUDA_ARCH__)
  return (a * b) ^ __umul64hi(a, b);
#else
  const unsigned __int128 p = static_cast<unsigned __int128>(a) * b;
  return static_cast<uint64_t>(p) ^ static_cast<uint64_t>(p >> 64);
#endif
}

KVPOOL_XXH3_FN uint64_t Avalanche(uint64_t h) {
  h ^= h >> 37;
  h *= 0x165667919E3779F9ULL;
  return h ^ (h >> 32);
}
KVPOOL_XXH3_FN uint64_t Xxh64Avalanche(uint64_t h) {
  h ^= h >> 33;
  h *= kPrime64_2;
  h ^= h >> 29;
  h *= kPrime64_3;
  return h ^ (h >> 32);
}
KVPOOL_XXH3_FN uint64_t Rrmxmx(uint64_t h, uint64_t len) {
  h ^= Rotl64(h, 49) ^ Rotl64(h, 24);
  h *= 0x9FB21C651E98DF25ULL;
  h ^= (h >> 35) + len;
  h *= 0x9FB21C651E98DF25ULL;
  return h ^ (h >> 28);
}
KVPOOL_XXH3_FN uint64_t Mix16(const uint8_t* in, const uint8_t* secret) {
  return Mul128Fold64(Read64(in) ^ Read64(secret), Read64(in + 8) ^ Read64(secret + 8));
}

// XXH3-64 of len <= kMaxShortBytes bytes at `in`.
KVPOOL_XXH3_FN uint64_t ShortHash(const uint8_t* in, uint64_t len, const uint8_t* secret) {
  if (len == 0) return Xxh64Avalanche(Read64(secret + 56) ^ Read64(secret + 64));
  if (len <= 3) {
    const uint32_t combined = uint32_t{in[0]} << 16 | uint32_t{in[len >> 1]} << 24 |
                              uint32_t{in[len - 1]} | static_cast<uint32_t>(len) << 8;
    const uint64_t bitflip = Read32(secret) ^ Read32(secret + 4);
    return Xxh64Avalanche(uint64_t{combined} ^ bitflip);
  }
  if (len <= 8) {
    const uint64_t bitflip = Read64(secret + 8) ^ Read64(secret + 16);
    const uint64_t input64 = Read32(in + len - 4) + (uint64_t{Read32(in)} << 32);
    return Rrmxmx(input64 ^ bitflip, len);
  }
  if (len <= 16) {
    const uint64_t lo = Read64(in) ^ (Read64(secret + 24) ^ Read64(secret + 32));
    const uint64_t hi = Read64(in + len - 8) ^ (Read64(secret + 40) ^ Read64(secret + 48));
    return Avalanche(len + Swap64(lo) + hi + Mul128Fold64(lo, hi));
  }
  uint64_t acc = len * kPrime64_1;
  if (len <= 128) {
    if (len > 32) {
      if (len > 64) {
        if (len > 96) {
          acc += Mix16(in + 48, secret + 96);
          acc += Mix16(in + len - 64, secret + 112);
        }
        acc += Mix16(in + 32, secret + 64);
        acc += Mix16(in + len - 48, secret + 80);
      }
      acc += Mix16(in + 16, secret + 32);
      acc += Mix16(in + len - 32, secret + 48);
    }
    acc += Mix16(in, secret);
    acc += Mix16(in + len - 16, secret + 16);
    return Avalanche(acc);
  }
  for (int i = 0; i < 8; ++i) acc += Mix16(in + 16 * i, secret + 16 * i);
  acc = Avalanche(acc);
  const int rounds = static_cast<int>(len / 16);
  for (int i = 8; i < rounds; ++i) acc += Mix16(in + 16 * i, secret + 16 * (i - 8) + 3);
  acc += Mix16(in + len - 16, secret + 136 - 17);
  return Avalanche(acc);
}

// The long loop's pieces. Lane `lane` (0..7) of the accumulator starts at InitLane(lane).
KVPOOL_XXH3_FN uint64_t InitLane(int lane) {
  switch (lane) {
    case 0: return kPrime32_3;
    case 1: return kPrime64_1;
    case 2: return kPrime64_2;
    case 3: return kPrime64_3;
    case 4: return kPrime64_4;
    case 5: return kPrime32_2;
    case 6: return kPrime64_5;
    default: return kPrime32_1;
  }
}

// Adds one stripe's words (data[0..7], little-endian words of its 64 bytes) keyed by the
// secret's words key[0..7] to the lanes' sums.
KVPOOL_XXH3_FN void StripeAdd(const uint64_t* data, const uint64_t* key, uint64_t* sums) {
  for (int i = 0; i < 8; ++i) {
    const uint64_t keyed = data[i] ^ key[i];
    sums[i ^ 1] += data[i];
    sums[i] += (keyed & 0xFFFFFFFFULL) * (keyed >> 32);
  }
}

// After a full block: scramble_key is the secret's word kScrambleSecret / 8 + lane.
KVPOOL_XXH3_FN uint64_t Scramble(uint64_t acc, uint64_t scramble_key) {
  acc ^= acc >> 47;
  acc ^= scramble_key;
  return acc * kPrime32_1;
}

// The final hash of the 8 lanes of an input of len bytes.
KVPOOL_XXH3_FN uint64_t MergeLanes(const uint64_t* acc, uint64_t len, const uint8_t* secret) {
  uint64_t result = len * kPrime64_1;
  for (int i = 0; i < 4; ++i) {
    const uint8_t* s = secret + kMergeSecret + 16 * i;
    result += Mul128Fold64(acc[2 * i] ^ Read64(s), acc[2 * i + 1] ^ Read64(s + 8));
  }
  return Avalanche(result);
}

// The shape of the long loop for an input of len > kMaxShortBytes bytes: `full_blocks` blocks
// are summed then scrambled; then `tail_stripes` stripes (from full_blocks * kBlockBytes, keys
// from the secret's start) are summed unscrambled, then the last 64 bytes of the input (keys at
// kLastStripeSecret).
struct LongShape {
  uint64_t full_blocks;
  int tail_stripes;
};
KVPOOL_XXH3_FN LongShape ShapeOf(uint64_t len) {
  const uint64_t blocks = (len - 1) / kBlockBytes;
  return {blocks, static_cast<int>(((len - 1) - blocks * kBlockBytes) / kStripeBytes)};
}

// XXH3-64 of any input through the pieces above (the host's own reference for the kernel's
// decomposition; tests compare it with libxxhash).
inline uint64_t Hash(const uint8_t* in, uint64_t len) {
  const uint8_t* secret = kDefaultSecret.bytes;
  if (len <= kMaxShortBytes) return ShortHash(in, len, secret);
  uint64_t words[kSecretWords];
  for (int w = 0; w < kSecretWords; ++w) words[w] = Read64(secret + 8 * w);
  uint64_t acc[8];
  for (int lane = 0; lane < 8; ++lane) acc[lane] = InitLane(lane);
  auto stripe = [&](const uint8_t* p, const uint64_t* key, uint64_t* sums) {
    uint64_t data[8];
    for (int i = 0; i < 8; ++i) data[i] = Read64(p + 8 * i);
    StripeAdd(data, key, sums);
  };
  const LongShape shape = ShapeOf(len);
  for (uint64_t b = 0; b < shape.full_blocks; ++b) {
    uint64_t sums[8] = {};
    // Backwards on purpose: the order of a block's stripes does not matter.
    for (int s = kStripesPerBlock - 1; s >= 0; --s) {
      stripe(in + b * kBlockBytes + s * kStripeBytes, words + s, sums);
    }
    for (int lane = 0; lane < 8; ++lane) {
      acc[lane] = Scramble(acc[lane] + sums[lane], words[kScrambleSecret / 8 + lane]);
    }
  }
  uint64_t sums[8] = {};
  for (int s = 0; s < shape.tail_stripes; ++s) {
    stripe(in + shape.full_blocks * kBlockBytes + s * kStripeBytes, words + s, sums);
  }
  uint64_t last_key[8];
  for (int i = 0; i < 8; ++i) last_key[i] = Read64(secret + kLastStripeSecret + 8 * i);
  stripe(in + len - kStripeBytes, last_key, sums);
  for (int lane = 0; lane < 8; ++lane) acc[lane] += sums[lane];
  return MergeLanes(acc, len, secret);
}

}  // namespace kvpool::kernels::xxh3
