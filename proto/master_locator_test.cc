#include "proto/master_locator.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvpool {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(MasterLocatorTest, OneAddressIsASingleMaster) {
  absl::StatusOr<std::unique_ptr<MasterLocator>> locator = MasterLocator::Create("m:50051");
  ASSERT_TRUE(locator.ok()) << locator.status();
  EXPECT_TRUE((*locator)->single());
  EXPECT_EQ((*locator)->Current(), "m:50051");
}

TEST(MasterLocatorTest, AListFollowsTheLeaderAStandbyNames) {
  absl::StatusOr<std::unique_ptr<MasterLocator>> locator =
      MasterLocator::Create("a:1, b:2,c:3,a:1");
  ASSERT_TRUE(locator.ok()) << locator.status();
  MasterLocator& l = **locator;
  EXPECT_FALSE(l.single());
  EXPECT_THAT(l.Masters(), ElementsAre("a:1", "b:2", "c:3"));
  EXPECT_EQ(l.Current(), "a:1");
  // A standby names the leader: straight there.
  l.Failed("a:1", "c:3");
  EXPECT_EQ(l.Current(), "c:3");
  // The leader does not answer: the next one.
  l.Failed("c:3", "");
  EXPECT_EQ(l.Current(), "a:1");
  l.Failed("a:1", "");
  EXPECT_EQ(l.Current(), "b:2");
  // A late report about a master already left behind changes nothing.
  l.Failed("a:1", "");
  EXPECT_EQ(l.Current(), "b:2");
  // A leader outside the list is followed too (and remembered).
  l.Failed("b:2", "d:4");
  EXPECT_EQ(l.Current(), "d:4");
  EXPECT_THAT(l.Masters(), ElementsAre("a:1", "b:2", "c:3", "d:4"));
}

TEST(MasterLocatorTest, MalformedAddressesAreRefusedByName) {
  EXPECT_THAT(MasterLocator::Create("a:1,nonsense").status().message(),
              HasSubstr("\"nonsense\" is not host:port"));
  EXPECT_THAT(MasterLocator::Create("").status().message(), HasSubstr("empty"));
  EXPECT_THAT(MasterLocator::Create("etcd://").status().message(),
              HasSubstr("no etcd endpoint"));
  EXPECT_THAT(MasterLocator::Create("etcd://e:notaport").status().message(),
              HasSubstr("host:port"));
  EXPECT_FALSE(MasterLocator::Create("a:0").ok());
  EXPECT_TRUE(ValidateMasterAddress("etcd://10.0.0.1:2379,10.0.0.2:2379").ok());
  EXPECT_TRUE(ValidateMasterAddress("a:1,b:2").ok());
  EXPECT_THAT(ValidateMasterAddress("etcd://x").message(), HasSubstr("host:port"));
  EXPECT_THAT(ValidateMasterAddress("http://m:1").message(), HasSubstr("is not host:port"));
}

}  // namespace
}  // namespace kvpool
