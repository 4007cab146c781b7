#include "proto/checksum.h"

#include <algorithm>
#include <string>

#include "gtest/gtest.h"

namespace kvpool::wire {
namespace {

TEST(ChecksumTest, DependsOnTheBytesNotOnHowTheyAreSplit) {
  std::string value(100000, '\0');
  for (size_t i = 0; i < value.size(); ++i) value[i] = static_cast<char>(i * 7 + 3);
  iovec whole{value.data(), value.size()};
  uint64_t one = Checksum({&whole, 1});
  std::vector<iovec> parts = {{value.data(), 10}, {value.data() + 10, 0}, {value.data() + 10, 99990}};
  EXPECT_EQ(Checksum(parts), one);
  value[54321] ^= 1;
  EXPECT_NE(Checksum({&whole, 1}), one);
}

TEST(ChecksumStreamTest, PiecesInOrderGiveTheChecksumOfTheWhole) {
  std::string value(3 << 20, '\0');
  for (size_t i = 0; i < value.size(); ++i) value[i] = static_cast<char>(i * 131 + (i >> 9));
  iovec whole{value.data(), value.size()};
  const uint64_t expected = Checksum({&whole, 1});
  ChecksumStream stream;
  // Pieces as a socket delivers them: odd sizes, some empty, some below a stripe.
  size_t at = 0;
  for (size_t piece = 1; at < value.size(); piece = (piece * 7 + 13) % 200003) {
    size_t n = std::min(piece, value.size() - at);
    stream.Update(value.data() + at, n);
    at += n;
  }
  EXPECT_EQ(stream.Digest(), expected);
  // A new value after Reset; and one byte changed changes it.
  stream.Reset();
  value[1 << 20] ^= 0x40;
  stream.Update(value.data(), value.size());
  EXPECT_NE(stream.Digest(), expected);
  EXPECT_EQ(stream.Digest(), Checksum({&whole, 1}));
  stream.Reset();
  iovec empty{nullptr, 0};
  EXPECT_EQ(stream.Digest(), Checksum({&empty, 1}));
}

}  // namespace
}  // namespace kvpool::wire
