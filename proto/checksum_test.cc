#include "proto/checksum.h"

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

}  // namespace
}  // namespace kvpool::wire
