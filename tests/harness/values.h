#pragma once

#include <cstdint>
#include <cstring>
#include <random>
#include <string>

namespace kvpool::testing {

// `size` pseudo-random bytes, the same for the same seed: what a test stores and checks.
inline std::string RandomValue(size_t size, uint32_t seed) {
  std::mt19937_64 rng(seed);
  std::string bytes(size, '\0');
  size_t i = 0;
  for (; i + 8 <= size; i += 8) {
    uint64_t word = rng();
    std::memcpy(&bytes[i], &word, 8);
  }
  for (; i < size; ++i) bytes[i] = static_cast<char>(rng());
  return bytes;
}

}  // namespace kvpool::testing
