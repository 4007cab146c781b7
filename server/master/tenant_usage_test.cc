// Per-tenant byte quotas through the master's core (no sockets): a tenant at its quota gets
// NO_AVAILABLE_HANDLE while others still put; its bytes come back when its objects go.

#include "server/master/tenant_usage.h"

#include "gtest/gtest.h"
#include "proto/capability.h"
#include "proto/error_codes.h"
#include "server/master/master.h"
#include "server/master/tenant_keys.h"

namespace kvpool::master {
namespace {

TEST(TenantQuotasTest, ParsesAndRefusesBadLists) {
  absl::StatusOr<absl::flat_hash_map<std::string, uint64_t>> quotas =
      ParseTenantQuotas("team-a=1MiB, team-b=4096");
  ASSERT_TRUE(quotas.ok()) << quotas.status();
  EXPECT_EQ(quotas->at("team-a"), 1u << 20);
  EXPECT_EQ(quotas->at("team-b"), 4096u);
  EXPECT_TRUE(ParseTenantQuotas("")->empty());
  EXPECT_FALSE(ParseTenantQuotas("team-a").ok());
  EXPECT_FALSE(ParseTenantQuotas("team-a=lots").ok());
  EXPECT_FALSE(ParseTenantQuotas("=1MiB").ok());
  EXPECT_FALSE(ParseTenantQuotas("a=1MiB,a=2MiB").ok());
}

class TenantQuotaMasterTest : public ::testing::Test {
 protected:
  TenantQuotaMasterTest() : master_(Options()) {
    SegmentInfo info;
    info.name = "seg";
    info.host = "host";
    info.endpoint = "seg:1";
    info.size = 64 << 20;
    info.incarnation = 1;
    info.token_secret = wire::NewCapabilitySecret();
    EXPECT_TRUE(master_.MountSegment(std::move(info)).ok());
  }

  static MasterOptions Options() {
    MasterOptions options;
    options.tenant_quotas = {{"team-a", 1 << 20}};
    return options;
  }

  // Reserves and commits `key` of `tenant`; the per-key status.
  absl::Status Put(const std::string& tenant, const std::string& key, uint64_t size) {
    std::string stored = TenantKey(tenant, key);
    absl::StatusOr<std::vector<PutStartResult>> started =
        master_.BatchPutStart({stored}, {size}, PutStartOptions{});
    if (!started.ok()) return started.status();
    if (!(*started)[0].status.ok()) return (*started)[0].status;
    return master_.BatchPutEnd({PutRef{stored, (*started)[0].put_id}}).results[0];
  }

  Master master_;
};

TEST_F(TenantQuotaMasterTest, ATenantAtItsQuotaIsUnderPressureAndOthersAreNot) {
  ASSERT_TRUE(Put("team-a", "k1", 600 << 10).ok());
  EXPECT_EQ(master_.tenant_usage().Used("team-a"), 600u << 10);
  absl::Status over = Put("team-a", "k2", 600 << 10);
  EXPECT_EQ(ToErrorCode(over), v1::NO_AVAILABLE_HANDLE) << over;
  EXPECT_NE(over.message().find("team-a"), std::string::npos) << over;
  // The pool has room (64 MiB): tenant b and the global namespace are not held back.
  EXPECT_TRUE(Put("team-b", "k2", 8 << 20).ok());
  EXPECT_TRUE(Put("", "k2", 8 << 20).ok());
  EXPECT_EQ(master_.tenant_usage().Used("team-b"), 8u << 20);
  // What fits still goes in, up to the quota exactly.
  EXPECT_TRUE(Put("team-a", "k3", 424 << 10).ok());
  EXPECT_EQ(ToErrorCode(Put("team-a", "k4", 1)), v1::NO_AVAILABLE_HANDLE);
  // Removing gives the bytes back.
  ASSERT_TRUE(master_.BatchRemove({TenantKey("team-a", "k1")}, true).results[0].ok());
  EXPECT_EQ(master_.tenant_usage().Used("team-a"), 424u << 10);
  EXPECT_TRUE(Put("team-a", "k5", 600 << 10).ok());
}

TEST_F(TenantQuotaMasterTest, RevokedAndReclaimedReservationsGiveTheirBytesBack) {
  std::string stored = TenantKey("team-a", "pending");
  absl::StatusOr<std::vector<PutStartResult>> started =
      master_.BatchPutStart({stored}, {900 << 10}, PutStartOptions{});
  ASSERT_TRUE(started.ok() && (*started)[0].status.ok());
  // Pending bytes count: a second reservation does not fit.
  EXPECT_EQ(ToErrorCode(Put("team-a", "other", 200 << 10)), v1::NO_AVAILABLE_HANDLE);
  ASSERT_TRUE(master_.BatchPutRevoke({PutRef{stored, (*started)[0].put_id}})[0].ok());
  EXPECT_EQ(master_.tenant_usage().Used("team-a"), 0u);
  EXPECT_TRUE(Put("team-a", "other", 200 << 10).ok());
  // RemoveAll empties every tenant's count.
  master_.RemoveAll(/*force=*/true);
  EXPECT_EQ(master_.tenant_usage().Used("team-a"), 0u);
}

}  // namespace
}  // namespace kvpool::master
