#include "server/common/exposure.h"

#include "gtest/gtest.h"

namespace kvpool {
namespace {

Exposure On(const std::string& address, bool tls, bool auth, bool insecure) {
  return Exposure{.listens = {{"--listen", address}, {"--http-listen", "127.0.0.1:9003"}},
                  .tls = tls,
                  .authenticated = auth,
                  .insecure = insecure};
}

TEST(ExposureTest, LoopbackNeedsNothingAndSaysSo) {
  for (const char* address : {"127.0.0.1:50051", "[::1]:50051", "localhost:1"}) {
    absl::StatusOr<ExposureVerdict> verdict = CheckExposure(On(address, false, false, false));
    ASSERT_TRUE(verdict.ok()) << address << verdict.status();
    EXPECT_FALSE(verdict->warning);
    EXPECT_NE(verdict->message.find("loopback only"), std::string::npos) << verdict->message;
  }
}

TEST(ExposureTest, OtherAddressesNeedTlsAndAuthOrInsecure) {
  for (auto [tls, auth] : {std::pair{false, false}, {true, false}, {false, true}}) {
    absl::StatusOr<ExposureVerdict> refused = CheckExposure(On("0.0.0.0:50051", tls, auth, false));
    ASSERT_FALSE(refused.ok());
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(refused.status().message().find("--listen=0.0.0.0:50051"), std::string::npos);
    EXPECT_NE(refused.status().message().find("--insecure"), std::string::npos);
    absl::StatusOr<ExposureVerdict> warned = CheckExposure(On("0.0.0.0:50051", tls, auth, true));
    ASSERT_TRUE(warned.ok());
    EXPECT_TRUE(warned->warning);
  }
  absl::StatusOr<ExposureVerdict> secured = CheckExposure(On("10.0.0.5:50051", true, true, false));
  ASSERT_TRUE(secured.ok());
  EXPECT_FALSE(secured->warning);
  EXPECT_FALSE(CheckExposure(On("not an address", false, false, true)).ok());
}

}  // namespace
}  // namespace kvpool
