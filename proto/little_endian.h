#pragma once

// Reading and writing the little-endian integers of kvpool's binary protocols.

#include <cstdint>
#include <cstring>

namespace kvpool::wire {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "kvpool's codecs assume little-endian");

template <typename T>
void StoreLittleEndian(uint8_t* out, T value) {
  std::memcpy(out, &value, sizeof(T));
}

template <typename T>
T LoadLittleEndian(const uint8_t* in) {
  T value;
  std::memcpy(&value, in, sizeof(T));
  return value;
}

}  // namespace kvpool::wire
