#include "server/master/master.h"

#include "gtest/gtest.h"
#include "proto/capability.h"
#include "proto/error_codes.h"

namespace kvpool::master {
namespace {

class MasterTest : public ::testing::Test {
 protected:
  MasterTest() : master_(Options()) {}

  MasterOptions Options() {
    MasterOptions options;
    options.max_key_bytes = 64;
    options.segment_ttl = absl::Seconds(10);
    options.clock = [this] { return now_; };
    return options;
  }

  SegmentInfo Segment(const std::string& name, uint64_t size, uint64_t incarnation = 1) {
    SegmentInfo info;
    info.name = name;
    info.host = "host-" + name;
    info.endpoint = name + ":1";
    info.size = size;
    info.incarnation = incarnation;
    info.token_secret = secrets_[name] = wire::NewCapabilitySecret();
    return info;
  }

  PutStartResult PutStart(const std::string& key, uint64_t size, uint32_t replicas = 1) {
    std::vector<std::string> keys = {key};
    std::vector<uint64_t> sizes = {size};
    return std::move(master_.BatchPutStart(keys, sizes, replicas).value()[0]);
  }

  absl::Status Put(const std::string& key, uint64_t size) {
    PutStartResult started = PutStart(key, size);
    if (!started.status.ok()) return started.status;
    return master_.BatchPutEnd({PutRef{key, started.put_id}})[0];
  }

  absl::Time now_ = absl::FromUnixSeconds(1'000'000);
  std::map<std::string, std::string> secrets_;
  Master master_;
};

TEST_F(MasterTest, TwoPhasePutIsInvisibleUntilCommitted) {
  ASSERT_TRUE(master_.MountSegment(Segment("a", 1 << 20)).ok());
  PutStartResult started = PutStart("k", 1000);
  ASSERT_TRUE(started.status.ok()) << started.status;
  ASSERT_EQ(started.placements.size(), 1u);
  EXPECT_EQ(started.placements[0].endpoint, "a:1");
  EXPECT_EQ(started.placements[0].length, 1000u);

  EXPECT_FALSE(*master_.BatchExist({"k"})[0]);
  EXPECT_EQ(master_.BatchGetReplicaList({"k"})[0].status.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(master_.GetClusterSummary().pending_objects, 1u);

  ASSERT_TRUE(master_.BatchPutEnd({PutRef{"k", started.put_id}})[0].ok());
  EXPECT_TRUE(*master_.BatchExist({"k"})[0]);
  GetResult got = master_.BatchGetReplicaList({"k"})[0];
  ASSERT_TRUE(got.status.ok());
  EXPECT_EQ(got.size, 1000u);
  ASSERT_EQ(got.replicas.size(), 1u);
  EXPECT_EQ(got.replicas[0].offset, started.placements[0].offset);
  ClusterSummary summary = master_.GetClusterSummary();
  EXPECT_EQ(summary.objects, 1u);
  EXPECT_EQ(summary.pending_objects, 0u);
  EXPECT_EQ(summary.used_bytes, 1024u);  // rounded to the allocator's alignment
}

TEST_F(MasterTest, TokensGrantExactlyThePlacementToItsSegment) {
  ASSERT_TRUE(master_.MountSegment(Segment("a", 1 << 20)).ok());
  PutStartResult started = PutStart("k", 4096);
  const PlacementView& p = started.placements[0];
  wire::RequestHeader write{.opcode = wire::Opcode::kWrite,
                            .offset = p.offset,
                            .length = p.length,
                            .token = p.token};
  EXPECT_TRUE(wire::VerifyToken(secrets_["a"], write, now_).ok());
  EXPECT_FALSE(wire::VerifyToken(secrets_["a"], write, now_ + absl::Minutes(2)).ok());
  wire::RequestHeader read = write;
  read.opcode = wire::Opcode::kRead;
  EXPECT_FALSE(wire::VerifyToken(secrets_["a"], read, now_).ok());
}

TEST_F(MasterTest, CommitAndRevokeNeedTheReservationsPutId) {
  ASSERT_TRUE(master_.MountSegment(Segment("a", 1 << 20)).ok());
  PutStartResult started = PutStart("k", 100);
  EXPECT_EQ(master_.BatchPutEnd({PutRef{"k", started.put_id + 1}})[0].code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(master_.BatchPutRevoke({PutRef{"k", started.put_id + 1}})[0].code(),
            absl::StatusCode::kNotFound);
  ASSERT_TRUE(master_.BatchPutRevoke({PutRef{"k", started.put_id}})[0].ok());
  EXPECT_EQ(master_.GetClusterSummary().used_bytes, 0u);
  EXPECT_EQ(master_.BatchPutEnd({PutRef{"k", started.put_id}})[0].code(),
            absl::StatusCode::kNotFound);
  EXPECT_FALSE(*master_.BatchExist({"k"})[0]);
}

TEST_F(MasterTest, DedupAnswersAlreadyExistsForCommittedAndInFlightKeys) {
  ASSERT_TRUE(master_.MountSegment(Segment("a", 1 << 20)).ok());
  PutStartResult first = PutStart("k", 100);
  ASSERT_TRUE(first.status.ok());
  EXPECT_EQ(ToErrorCode(PutStart("k", 100).status), v1::OBJECT_ALREADY_EXISTS);
  ASSERT_TRUE(master_.BatchPutEnd({PutRef{"k", first.put_id}})[0].ok());
  PutStartResult again = PutStart("k", 100);
  EXPECT_EQ(ToErrorCode(again.status), v1::OBJECT_ALREADY_EXISTS);
  EXPECT_TRUE(again.placements.empty());
}

TEST_F(MasterTest, BadKeysAndSizesGetPerKeyErrorsWhileTheBatchProceeds) {
  ASSERT_TRUE(master_.MountSegment(Segment("a", 1 << 20)).ok());
  std::vector<std::string> keys = {"", std::string(65, 'x'), "zero", "huge", "fine"};
  std::vector<uint64_t> sizes = {1, 1, 0, 2 << 20, 10};
  std::vector<PutStartResult> results = master_.BatchPutStart(keys, sizes, 1).value();
  EXPECT_EQ(ToErrorCode(results[0].status), v1::INVALID_KEY);
  EXPECT_EQ(ToErrorCode(results[1].status), v1::INVALID_KEY);
  EXPECT_EQ(ToErrorCode(results[2].status), v1::INVALID_PARAMS);
  EXPECT_EQ(ToErrorCode(results[3].status), v1::INVALID_PARAMS);
  EXPECT_NE(results[3].status.message().find("larger than any segment"), std::string::npos);
  EXPECT_TRUE(results[4].status.ok());

  std::vector<uint64_t> short_sizes = {1};
  EXPECT_EQ(master_.BatchPutStart(keys, short_sizes, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ToErrorCode(master_.BatchExist({""})[0].status()), v1::INVALID_KEY);
}

TEST_F(MasterTest, FullPoolAnswersNoAvailableHandlePerKey) {
  ASSERT_TRUE(master_.MountSegment(Segment("a", 4096)).ok());
  std::vector<std::string> keys = {"a", "b", "c"};
  std::vector<uint64_t> sizes = {2048, 2048, 64};
  std::vector<PutStartResult> results = master_.BatchPutStart(keys, sizes, 1).value();
  EXPECT_TRUE(results[0].status.ok());
  EXPECT_TRUE(results[1].status.ok());
  EXPECT_EQ(ToErrorCode(results[2].status), v1::NO_AVAILABLE_HANDLE);
}

TEST_F(MasterTest, NoSegmentMeansPressureNotAnError) {
  EXPECT_EQ(ToErrorCode(PutStart("k", 10).status), v1::NO_AVAILABLE_HANDLE);
}

TEST_F(MasterTest, ReplicasGoToDistinctSegmentsWithTheMostFreeSpace) {
  ASSERT_TRUE(master_.MountSegment(Segment("a", 1 << 20)).ok());
  ASSERT_TRUE(master_.MountSegment(Segment("b", 2 << 20)).ok());
  ASSERT_TRUE(master_.MountSegment(Segment("c", 1 << 20)).ok());
  PutStartResult one = PutStart("one", 1000);
  EXPECT_EQ(one.placements[0].segment_name, "b");
  PutStartResult two = PutStart("two", 1000, 2);
  ASSERT_EQ(two.placements.size(), 2u);
  EXPECT_NE(two.placements[0].segment_name, two.placements[1].segment_name);
  PutStartResult many = PutStart("many", 1000, 5);
  EXPECT_EQ(many.placements.size(), 3u);  // as many as there are segments
}

TEST_F(MasterTest, RemoveFreesSpaceAndRemoveAllLeavesReservations) {
  ASSERT_TRUE(master_.MountSegment(Segment("a", 1 << 20)).ok());
  ASSERT_TRUE(Put("x", 1000).ok());
  ASSERT_TRUE(Put("y", 1000).ok());
  PutStartResult pending = PutStart("z", 1000);
  EXPECT_TRUE(master_.BatchRemove({"x"})[0].ok());
  EXPECT_EQ(master_.BatchRemove({"x"})[0].code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(master_.BatchRemove({"z"})[0].code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(master_.RemoveAll(), 1u);
  ClusterSummary summary = master_.GetClusterSummary();
  EXPECT_EQ(summary.objects, 0u);
  EXPECT_EQ(summary.pending_objects, 1u);
  EXPECT_EQ(summary.used_bytes, 1024u);
}

TEST_F(MasterTest, SilentSegmentIsDeclaredDeadAfterTheTtlWithItsObjects) {
  ASSERT_TRUE(master_.MountSegment(Segment("a", 1 << 20)).ok());
  ASSERT_TRUE(master_.MountSegment(Segment("b", 1 << 20)).ok());
  std::vector<std::string> keys = {"both", "only"};
  std::vector<uint64_t> sizes = {100, 100};
  PutStartResult both = PutStart("both", 100, 2);
  ASSERT_TRUE(master_.BatchPutEnd({PutRef{"both", both.put_id}})[0].ok());
  PutStartResult only = PutStart("only", 100);
  ASSERT_TRUE(master_.BatchPutEnd({PutRef{"only", only.put_id}})[0].ok());
  std::string lost_segment = only.placements[0].segment_name;
  std::string kept_segment = lost_segment == "a" ? "b" : "a";

  now_ += absl::Seconds(8);
  EXPECT_TRUE(master_.Heartbeat(kept_segment, 1));
  EXPECT_FALSE(master_.Heartbeat("nobody", 1));
  EXPECT_FALSE(master_.Heartbeat(kept_segment, 2));  // wrong incarnation
  now_ += absl::Seconds(3);
  EXPECT_EQ(master_.ExpireSegments(), 1u);
  EXPECT_FALSE(master_.Heartbeat(lost_segment, 1));  // told to mount again

  EXPECT_FALSE(*master_.BatchExist({"only"})[0]);
  GetResult got = master_.BatchGetReplicaList({"both"})[0];
  ASSERT_TRUE(got.status.ok());
  ASSERT_EQ(got.replicas.size(), 1u);
  EXPECT_EQ(got.replicas[0].segment_name, kept_segment);
  EXPECT_EQ(master_.GetClusterSummary().segments.size(), 1u);
}

TEST_F(MasterTest, RestartedSegmentReplacesItsOldIncarnation) {
  ASSERT_TRUE(master_.MountSegment(Segment("a", 1 << 20, 1)).ok());
  ASSERT_TRUE(Put("k", 100).ok());
  ASSERT_TRUE(master_.MountSegment(Segment("a", 1 << 20, 1)).ok());  // retried mount
  EXPECT_TRUE(*master_.BatchExist({"k"})[0]);
  ASSERT_TRUE(master_.MountSegment(Segment("a", 1 << 20, 2)).ok());  // new process
  EXPECT_FALSE(*master_.BatchExist({"k"})[0]);
  EXPECT_EQ(master_.GetClusterSummary().used_bytes, 0u);
}

TEST_F(MasterTest, UnmountDropsObjectsAndCountsThem) {
  ASSERT_TRUE(master_.MountSegment(Segment("a", 1 << 20)).ok());
  ASSERT_TRUE(Put("k1", 100).ok());
  ASSERT_TRUE(Put("k2", 100).ok());
  EXPECT_EQ(master_.UnmountSegment("a", 9).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(*master_.UnmountSegment("a", 1), 2u);
  EXPECT_FALSE(*master_.BatchExist({"k1"})[0]);
}

TEST_F(MasterTest, MalformedMountsAreRefused) {
  SegmentInfo no_name = Segment("", 1 << 20);
  EXPECT_EQ(master_.MountSegment(no_name).code(), absl::StatusCode::kInvalidArgument);
  SegmentInfo tiny = Segment("a", 1);
  EXPECT_EQ(master_.MountSegment(tiny).code(), absl::StatusCode::kInvalidArgument);
  SegmentInfo no_secret = Segment("a", 1 << 20);
  no_secret.token_secret.clear();
  EXPECT_EQ(master_.MountSegment(no_secret).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvpool::master
