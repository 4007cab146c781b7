#include "common/size.h"

#include "gtest/gtest.h"

namespace kvpool {
namespace {

TEST(ParseSizeTest, AcceptsBytesAndBinaryUnits) {
  EXPECT_EQ(*ParseSize("4096"), 4096u);
  EXPECT_EQ(*ParseSize("0"), 0u);
  EXPECT_EQ(*ParseSize("512MB"), 512ull << 20);
  EXPECT_EQ(*ParseSize("512MiB"), 512ull << 20);
  EXPECT_EQ(*ParseSize("4GiB"), 4ull << 30);
  EXPECT_EQ(*ParseSize("80GB"), 80ull << 30);
  EXPECT_EQ(*ParseSize("80gb"), 80ull << 30);
  EXPECT_EQ(*ParseSize(" 1.5 GiB "), 3ull << 29);
  EXPECT_EQ(*ParseSize("2k"), 2048u);
  EXPECT_EQ(*ParseSize("1TiB"), 1ull << 40);
  EXPECT_EQ(*ParseSize("7B"), 7u);
}

TEST(ParseSizeTest, RejectsMalformedInputWithAReason) {
  for (const char* bad : {"", "GB", "-1GB", "4XB", "1.5", "0.3B", "1e3", "4 G B", "18446744073709551616",
                          "17179869184GiB", "1..5GB"}) {
    absl::StatusOr<uint64_t> parsed = ParseSize(bad);
    EXPECT_FALSE(parsed.ok()) << "\"" << bad << "\" parsed as " << parsed.value_or(0);
    if (!parsed.ok()) {
      EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_FALSE(parsed.status().message().empty());
    }
  }
}

TEST(FormatSizeTest, PicksTheLargestUnit) {
  EXPECT_EQ(FormatSize(0), "0 B");
  EXPECT_EQ(FormatSize(1023), "1023 B");
  EXPECT_EQ(FormatSize(1536), "1.50 KiB");
  EXPECT_EQ(FormatSize(4ull << 30), "4.00 GiB");
}

TEST(ByteSizeFlagTest, ParsesAndReportsErrors) {
  ByteSize size;
  std::string error;
  EXPECT_TRUE(AbslParseFlag("1GiB", &size, &error));
  EXPECT_EQ(size.bytes, 1ull << 30);
  EXPECT_EQ(AbslUnparseFlag(size), "1073741824");
  EXPECT_FALSE(AbslParseFlag("lots", &size, &error));
  EXPECT_NE(error.find("lots"), std::string::npos);
}

}  // namespace
}  // namespace kvpool
