#include "common/net.h"

#include "gtest/gtest.h"

namespace kvpool {
namespace {

TEST(HostPortTest, ParsesNamesIpv4AndBracketedIpv6) {
  absl::StatusOr<HostPort> a = ParseHostPort("127.0.0.1:50051");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->host, "127.0.0.1");
  EXPECT_EQ(a->port, 50051);
  absl::StatusOr<HostPort> b = ParseHostPort("[::1]:0");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->host, "::1");
  EXPECT_EQ(b->port, 0);
  EXPECT_EQ(FormatHostPort("::1", 7), "[::1]:7");
  EXPECT_EQ(FormatHostPort("node-3", 50061), "node-3:50061");
}

TEST(HostPortTest, RejectsMissingOrBadPorts) {
  for (const char* bad : {"localhost", ":50051", "host:", "host:65536", "host:-1", "host:http"}) {
    EXPECT_FALSE(ParseHostPort(bad).ok()) << bad;
  }
}

TEST(ResolveHostTest, KeepsLiteralsAndResolvesNames) {
  EXPECT_EQ(ResolveHost("10.1.2.3").value_or(""), "10.1.2.3");
  EXPECT_EQ(ResolveHost("::1").value_or(""), "::1");
  EXPECT_EQ(ResolveHost("localhost").value_or(""), "127.0.0.1");
  EXPECT_EQ(ResolveHost("LocalHost").value_or(""), "127.0.0.1");
  EXPECT_EQ(ResolveHost("engine-0.localhost").value_or(""), "127.0.0.1");
  absl::StatusOr<std::string> own = ResolveHost(LocalHostName());
  EXPECT_TRUE(own.ok()) << own.status();
  EXPECT_TRUE(absl::IsNotFound(ResolveHost("no-such-host.invalid").status()));
}

}  // namespace
}  // namespace kvpool
