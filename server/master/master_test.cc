#include "server/master/master.h"

#include <algorithm>
#include <limits>
#include <map>
#include <optional>

#include "absl/container/flat_hash_set.h"
#include "gtest/gtest.h"
#include "proto/capability.h"
#include "proto/error_codes.h"
#include "proto/key_read.h"

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
    // The same process mounting again keeps its secret (a new one is a new term).
    if (incarnations_[name] != incarnation || !secrets_.contains(name)) {
      secrets_[name] = wire::NewCapabilitySecret();
    }
    incarnations_[name] = incarnation;
    info.token_secret = secrets_[name];
    return info;
  }

  // Every mounted segment applies every manifest record queued for it (what its heartbeat
  // long poll does): ended grants are acknowledged and their ranges given back.
  void Applied() {
    for (const auto& [name, incarnation] : incarnations_) {
      if (std::optional<SegmentId> id = master_.Heartbeat(name, incarnation).segment) {
        master_.manifest_sync().Sync(*id, std::numeric_limits<uint64_t>::max(), 0);
      }
    }
  }

  // What Wait answers for `ticket` right away (nullopt: it parked the wait).
  std::optional<bool> WaitNow(const ManifestSync::Ticket& ticket) {
    std::optional<bool> durable;
    master_.manifest_sync().Wait(ticket, now_ + absl::Hours(1), [&](bool ok) { durable = ok; });
    return durable;
  }

  PutStartResult PutStart(const std::string& key, uint64_t size, uint32_t replicas = 1,
                          PinMode pin = PinMode::kNone) {
    std::vector<std::string> keys = {key};
    std::vector<uint64_t> sizes = {size};
    return std::move(
        master_.BatchPutStart(keys, sizes, {.replica_num = replicas, .pin = pin}).value()[0]);
  }

  absl::Status Commit(const std::string& key, uint64_t put_id) {
    absl::Status status = master_.BatchPutEnd({PutRef{key, put_id}}).results[0];
    Applied();
    return status;
  }

  absl::Status Put(const std::string& key, uint64_t size, PinMode pin = PinMode::kNone) {
    PutStartResult started = PutStart(key, size, 1, pin);
    if (!started.status.ok()) return started.status;
    return Commit(key, started.put_id);
  }

  absl::Status Remove(const std::string& key, bool force = false) {
    return master_.BatchRemove({key}, force).results[0];
  }

  bool Exists(const std::string& key) { return *master_.BatchExist({key})[0]; }

  absl::Time now_ = absl::FromUnixSeconds(1'000'000);
  std::map<std::string, std::string> secrets_;
  std::map<std::string, uint64_t> incarnations_;
  Master master_;
};

// Ids come a block of 512 at a time: across blocks they stay distinct and never 0.
TEST(GrantIdsTest, DistinctAndNeverZeroAcrossBlocks) {
  GrantIds ids;
  absl::flat_hash_set<uint64_t> seen;
  for (int i = 0; i < 4000; ++i) {
    uint64_t id = ids.Next();
    EXPECT_NE(id, 0u);
    EXPECT_TRUE(seen.insert(id).second) << "id " << id << " drawn twice";
  }
}

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

  ASSERT_TRUE(Commit("k", started.put_id).ok());
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

// A reader through shared memory asks for no tokens: the same placements and lease, none
// minted.
TEST_F(MasterTest, LocationsWithoutTokensForSharedMemoryReaders) {
  ASSERT_TRUE(master_.MountSegment(Segment("a", 1 << 20)).ok());
  ASSERT_TRUE(Put("k", 100).ok());
  GetResult minted = master_.BatchGetReplicaList({"k"})[0];
  GetResult bare = master_.BatchGetReplicaList({"k"}, ReadTokens::kLeftOut)[0];
  ASSERT_TRUE(bare.status.ok()) << bare.status;
  ASSERT_EQ(bare.replicas.size(), 1u);
  ASSERT_EQ(minted.replicas.size(), 1u);
  EXPECT_TRUE(minted.replicas[0].token.has_value());
  EXPECT_FALSE(bare.replicas[0].token.has_value());
  EXPECT_EQ(bare.replicas[0].endpoint, minted.replicas[0].endpoint);
  EXPECT_EQ(bare.replicas[0].offset, minted.replicas[0].offset);
  EXPECT_EQ(bare.replicas[0].length, 100u);
  EXPECT_EQ(bare.size, 100u);
  EXPECT_GT(bare.lease_expiry, now_);
  EXPECT_EQ(master_.BatchGetReplicaList({"absent"}, ReadTokens::kLeftOut)[0].status.code(),
            absl::StatusCode::kNotFound);
}

TEST_F(MasterTest, TokensGrantExactlyThePlacementToItsSegment) {
  ASSERT_TRUE(master_.MountSegment(Segment("a", 1 << 20)).ok());
  PutStartResult started = PutStart("k", 4096);
  const PlacementView& p = started.placements[0];
  wire::RequestHeader write{.opcode = wire::Opcode::kWrite,
                            .offset = p.offset,
                            .length = p.length,
                            .token = *p.token};
  EXPECT_TRUE(wire::VerifyToken(secrets_["a"], write, now_).ok());
  EXPECT_FALSE(wire::VerifyToken(secrets_["a"], write, now_ + absl::Minutes(2)).ok());
  wire::RequestHeader read = write;
  read.opcode = wire::Opcode::kRead;
  EXPECT_FALSE(wire::VerifyToken(secrets_["a"], read, now_).ok());
}

TEST_F(MasterTest, CommitAndRevokeNeedTheReservationsPutId) {
  ASSERT_TRUE(master_.MountSegment(Segment("a", 1 << 20)).ok());
  PutStartResult started = PutStart("k", 100);
  EXPECT_EQ(Commit("k", started.put_id + 1).code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(master_.BatchPutRevoke({PutRef{"k", started.put_id + 1}})[0].code(),
            absl::StatusCode::kNotFound);
  ASSERT_TRUE(master_.BatchPutRevoke({PutRef{"k", started.put_id}})[0].ok());
  // The write token is still alive: the range waits until the segment ends the grant.
  EXPECT_EQ(master_.GetClusterSummary().used_bytes, 128u);
  Applied();
  EXPECT_EQ(master_.GetClusterSummary().used_bytes, 0u);
  EXPECT_EQ(Commit("k", started.put_id).code(),
            absl::StatusCode::kNotFound);
  EXPECT_FALSE(*master_.BatchExist({"k"})[0]);
}

TEST_F(MasterTest, DedupAnswersAlreadyExistsForCommittedAndInFlightKeys) {
  ASSERT_TRUE(master_.MountSegment(Segment("a", 1 << 20)).ok());
  PutStartResult first = PutStart("k", 100);
  ASSERT_TRUE(first.status.ok());
  EXPECT_EQ(ToErrorCode(PutStart("k", 100).status), v1::OBJECT_ALREADY_EXISTS);
  ASSERT_TRUE(Commit("k", first.put_id).ok());
  PutStartResult again = PutStart("k", 100);
  EXPECT_EQ(ToErrorCode(again.status), v1::OBJECT_ALREADY_EXISTS);
  EXPECT_TRUE(again.placements.empty());
}

TEST_F(MasterTest, BadKeysAndSizesGetPerKeyErrorsWhileTheBatchProceeds) {
  ASSERT_TRUE(master_.MountSegment(Segment("a", 1 << 20)).ok());
  std::vector<std::string> keys = {"", std::string(65, 'x'), "zero", "huge", "fine"};
  std::vector<uint64_t> sizes = {1, 1, 0, 2 << 20, 10};
  std::vector<PutStartResult> results = master_.BatchPutStart(keys, sizes, {}).value();
  EXPECT_EQ(ToErrorCode(results[0].status), v1::INVALID_KEY);
  EXPECT_EQ(ToErrorCode(results[1].status), v1::INVALID_KEY);
  EXPECT_EQ(ToErrorCode(results[2].status), v1::INVALID_PARAMS);
  EXPECT_EQ(ToErrorCode(results[3].status), v1::INVALID_PARAMS);
  EXPECT_NE(results[3].status.message().find("larger than any segment"), std::string::npos);
  EXPECT_TRUE(results[4].status.ok());

  std::vector<uint64_t> short_sizes = {1};
  EXPECT_EQ(master_.BatchPutStart(keys, short_sizes, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ToErrorCode(master_.BatchExist({""})[0].status()), v1::INVALID_KEY);
}

TEST_F(MasterTest, FullPoolAnswersNoAvailableHandlePerKey) {
  ASSERT_TRUE(master_.MountSegment(Segment("a", 4096)).ok());
  std::vector<std::string> keys = {"a", "b", "c"};
  std::vector<uint64_t> sizes = {2048, 2048, 64};
  std::vector<PutStartResult> results = master_.BatchPutStart(keys, sizes, {}).value();
  EXPECT_TRUE(results[0].status.ok());
  EXPECT_TRUE(results[1].status.ok());
  EXPECT_EQ(ToErrorCode(results[2].status), v1::NO_AVAILABLE_HANDLE);
}

TEST_F(MasterTest, NoSegmentMeansPressureNotAnError) {
  EXPECT_EQ(ToErrorCode(PutStart("k", 10).status), v1::NO_AVAILABLE_HANDLE);
}

// The key's home segment (proto/key_read.h: where readers by key look) of a, b, c.
std::string HomeOf(const std::string& key, const std::map<std::string, uint64_t>& capacities) {
  std::string home;
  double best = 0;
  for (const auto& [name, capacity] : capacities) {
    double score = wire::HomeScore(key, name, capacity);
    if (home.empty() || score > best) home = name, best = score;
  }
  return home;
}

TEST_F(MasterTest, ReplicasGoToTheKeysHomeThenDistinctSegmentsWithTheMostFreeSpace) {
  ASSERT_TRUE(master_.MountSegment(Segment("a", 1 << 20)).ok());
  ASSERT_TRUE(master_.MountSegment(Segment("b", 2 << 20)).ok());
  ASSERT_TRUE(master_.MountSegment(Segment("c", 1 << 20)).ok());
  const std::map<std::string, uint64_t> capacities = {
      {"a", 1 << 20}, {"b", 2 << 20}, {"c", 1 << 20}};
  for (int i = 0; i < 20; ++i) {
    std::string key = "one-" + std::to_string(i);
    PutStartResult one = PutStart(key, 1000);
    EXPECT_EQ(one.placements[0].segment_name, HomeOf(key, capacities)) << key;
  }
  PutStartResult two = PutStart("two", 1000, 2);
  ASSERT_EQ(two.placements.size(), 2u);
  EXPECT_EQ(two.placements[0].segment_name, HomeOf("two", capacities));
  EXPECT_NE(two.placements[0].segment_name, two.placements[1].segment_name);
  // After the home, the most free: b, unless b is the home (then a or c).
  if (two.placements[0].segment_name != "b") EXPECT_EQ(two.placements[1].segment_name, "b");
  PutStartResult many = PutStart("many", 1000, 5);
  EXPECT_EQ(many.placements.size(), 3u);  // as many as there are segments
}

TEST_F(MasterTest, AFullHomeSendsTheKeyToTheMostFreeSegment) {
  ASSERT_TRUE(master_.MountSegment(Segment("a", 64 << 10)).ok());
  ASSERT_TRUE(master_.MountSegment(Segment("b", 1 << 20)).ok());
  const std::map<std::string, uint64_t> capacities = {{"a", 64 << 10}, {"b", 1 << 20}};
  // Fill a with keys whose home it is; the next such key goes to b.
  int placed_on_a = 0;
  for (int i = 0; i < 1000 && placed_on_a < 16; ++i) {
    std::string key = "k" + std::to_string(i);
    if (HomeOf(key, capacities) != "a") continue;
    PutStartResult put = PutStart(key, 4096);
    ASSERT_TRUE(put.status.ok()) << put.status;
    EXPECT_EQ(put.placements[0].segment_name, placed_on_a < 16 ? "a" : "b");
    ++placed_on_a;
  }
  ASSERT_EQ(placed_on_a, 16);
  for (int i = 1000; i < 2000; ++i) {
    std::string key = "k" + std::to_string(i);
    if (HomeOf(key, capacities) != "a") continue;
    PutStartResult put = PutStart(key, 4096);
    ASSERT_TRUE(put.status.ok()) << put.status;
    EXPECT_EQ(put.placements[0].segment_name, "b");
    break;
  }
}

TEST_F(MasterTest, RemoveFreesSpaceAndRemoveAllLeavesReservations) {
  ASSERT_TRUE(master_.MountSegment(Segment("a", 1 << 20)).ok());
  ASSERT_TRUE(Put("x", 1000).ok());
  ASSERT_TRUE(Put("y", 1000).ok());
  PutStartResult pending = PutStart("z", 1000);
  EXPECT_TRUE(Remove("x").ok());
  // Durable and answered so (what the service does): removing again finds nothing.
  Applied();
  master_.SettleRemovals({std::string("x")});
  EXPECT_EQ(Remove("x").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(Remove("z").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(master_.RemoveAll(false).results[0], 1u);
  Applied();
  ClusterSummary summary = master_.GetClusterSummary();
  EXPECT_EQ(summary.objects, 0u);
  EXPECT_EQ(summary.pending_objects, 1u);
  EXPECT_EQ(summary.used_bytes, 1024u);
}

TEST_F(MasterTest, RemoveAllWithAKeyFilterRemovesOnlyMatchingKeys) {
  ASSERT_TRUE(master_.MountSegment(Segment("a", 1 << 20)).ok());
  for (const char* key : {"model@tp0@h1", "model@tp1@h2", "other@tp0@h3", "xmodel"}) {
    ASSERT_TRUE(Put(key, 100).ok()) << key;
  }
  RE2 tp0("@tp0@");
  EXPECT_EQ(master_.RemoveAll(false, &tp0).results[0], 2u);
  RE2 anchored("^model");
  EXPECT_EQ(master_.RemoveAll(false, &anchored).results[0], 1u);  // model@tp1@h2, not xmodel
  EXPECT_EQ(Remove("model@tp1@h2").code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(Remove("xmodel").ok());
  EXPECT_EQ(master_.GetClusterSummary().objects, 0u);
}

TEST_F(MasterTest, DropReplicasLeavesTheOtherReplicasAndHonoursLeases) {
  ASSERT_TRUE(master_.MountSegment(Segment("a", 1 << 20)).ok());
  ASSERT_TRUE(master_.MountSegment(Segment("b", 1 << 20)).ok());
  PutStartResult two = PutStart("two", 1000, 2);
  ASSERT_EQ(two.placements.size(), 2u);
  ASSERT_TRUE(Commit("two", two.put_id).ok());
  ASSERT_TRUE(Put("one", 1000).ok());
  std::string one_segment = master_.BatchGetReplicaList({"one"})[0].replicas[0].segment_name;
  now_ += absl::Seconds(11);  // the get's lease is over

  std::vector<std::string> keys = {"two", "absent", ""};
  Durable<absl::Status> dropped = master_.BatchDropReplicas(keys, "a", false);
  ASSERT_EQ(dropped.results.size(), 3u);
  EXPECT_TRUE(dropped.results[0].ok()) << dropped.results[0];
  EXPECT_EQ(dropped.results[1].code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(dropped.results[2].code(), absl::StatusCode::kInvalidArgument);
  Applied();
  GetResult left = master_.BatchGetReplicaList({"two"})[0];
  ASSERT_TRUE(left.status.ok()) << left.status;
  ASSERT_EQ(left.replicas.size(), 1u);
  EXPECT_EQ(left.replicas[0].segment_name, "b");
  // No replica there any more; an empty segment name is refused.
  EXPECT_EQ(master_.BatchDropReplicas({"two"}, "a", false).results[0].code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(master_.BatchDropReplicas({"two"}, "", false).results[0].code(),
            absl::StatusCode::kInvalidArgument);
  // The get above leased it: refused unless forced.
  absl::Status leased = master_.BatchDropReplicas({"two"}, "b", false).results[0];
  EXPECT_EQ(ToErrorCode(leased), v1::OBJECT_HAS_LEASE) << leased;
  // Dropping an object's only replica removes the object and frees its space.
  EXPECT_TRUE(master_.BatchDropReplicas({"two"}, "b", true).results[0].ok());
  EXPECT_TRUE(master_.BatchDropReplicas({"one"}, one_segment, false).results[0].ok());
  Applied();
  EXPECT_FALSE(Exists("two"));
  EXPECT_FALSE(Exists("one"));
  ClusterSummary summary = master_.GetClusterSummary();
  EXPECT_EQ(summary.objects, 0u);
  EXPECT_EQ(summary.used_bytes, 0u);
}

// The segments holding `key`'s committed replicas, as a reader is told.
std::vector<std::string> ReplicaSegments(Master& master, const std::string& key) {
  std::vector<std::string> names;
  std::vector<GetResult> got = master.BatchGetReplicaList({key});
  for (const PlacementView& replica : got[0].replicas) {
    names.push_back(replica.segment_name);
  }
  std::sort(names.begin(), names.end());
  return names;
}

TEST_F(MasterTest, PreferredSegmentsAreTriedFirstByNameInOrder) {
  for (const char* name : {"a", "b", "c"}) {
    ASSERT_TRUE(master_.MountSegment(Segment(name, 1 << 20)).ok());
  }
  std::vector<std::string> keys = {"k1"};
  std::vector<uint64_t> sizes = {1000};
  PutStartOptions options{.replica_num = 2, .preferred_segments = {"c", "nowhere", "a"}};
  PutStartResult started = std::move(master_.BatchPutStart(keys, sizes, options).value()[0]);
  ASSERT_TRUE(started.status.ok()) << started.status;
  ASSERT_EQ(started.placements.size(), 2u);
  EXPECT_EQ(started.placements[0].segment_name, "c");
  EXPECT_EQ(started.placements[1].segment_name, "a");
  // A preferred segment without room is passed over.
  keys = {"big"};
  sizes = {(1 << 20) - 1000};
  options = {.replica_num = 1, .preferred_segments = {"c"}};
  PutStartResult big = std::move(master_.BatchPutStart(keys, sizes, options).value()[0]);
  ASSERT_TRUE(big.status.ok()) << big.status;
  EXPECT_NE(big.placements[0].segment_name, "c");
}

TEST_F(MasterTest, CopyTaskAddsAReplicaOnEachNamedSegmentAndKeepsTheSource) {
  for (const char* name : {"a", "b", "c"}) {
    ASSERT_TRUE(master_.MountSegment(Segment(name, 1 << 20)).ok());
  }
  std::vector<std::string> keys = {"k"};
  std::vector<uint64_t> sizes = {1000};
  PutStartResult put = std::move(
      master_.BatchPutStart(keys, sizes, {.preferred_segments = {"a"}}).value()[0]);
  ASSERT_TRUE(master_.BatchPutEnd({PutRef{"k", put.put_id, 42}}).results[0].ok());
  Applied();
  std::vector<std::string> targets = {"b", "c"};
  // A dry run checks and reserves nothing.
  ASSERT_TRUE(master_.ReplicaCopyStart("k", targets, "", false, true).ok());
  EXPECT_EQ(master_.GetClusterSummary().used_bytes, 1024u);
  for (const char* expected : {"b", "c"}) {
    absl::StatusOr<MigrationPlan> plan = master_.ReplicaCopyStart("k", targets, "", false, false);
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_EQ(plan->source.segment_name, "a");
    EXPECT_EQ(plan->destination.segment_name, expected);
    EXPECT_EQ(plan->checksum, 42u);
    // One copy at a time: a second start waits for it.
    EXPECT_EQ(ToErrorCode(master_.ReplicaCopyStart("k", targets, "", false, false).status()),
              v1::OBJECT_HAS_LEASE);
    // Leased while in flight: not removed unless forced.
    EXPECT_EQ(ToErrorCode(Remove("k")), v1::OBJECT_HAS_LEASE);
    // A drain's MigrateEnd does not end a task's copy.
    EXPECT_EQ(master_.MigrateEnd({{"k", plan->id, true}}).results[0].code(),
              absl::StatusCode::kNotFound);
    Durable<absl::Status> ended = master_.ReplicaCopyEnd({{"k", plan->id, true}});
    ASSERT_TRUE(ended.results[0].ok()) << ended.results[0];
    Applied();
  }
  EXPECT_EQ(ReplicaSegments(master_, "k"), (std::vector<std::string>{"a", "b", "c"}));
  // Every target holds one now.
  EXPECT_EQ(master_.ReplicaCopyStart("k", targets, "", false, false).status().code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(master_.GetClusterSummary().used_bytes, 3 * 1024u);
}

TEST_F(MasterTest, MoveTaskReplacesTheSourceInOneStepAndAFailureLeavesItIntact) {
  for (const char* name : {"a", "b"}) {
    ASSERT_TRUE(master_.MountSegment(Segment(name, 1 << 20)).ok());
  }
  std::vector<std::string> keys = {"k"};
  std::vector<uint64_t> sizes = {1000};
  PutStartResult put = std::move(
      master_.BatchPutStart(keys, sizes, {.preferred_segments = {"a"}}).value()[0]);
  ASSERT_TRUE(Commit("k", put.put_id).ok());
  std::vector<std::string> to_b = {"b"};
  // A failed copy: given back, the object as it was.
  absl::StatusOr<MigrationPlan> failed = master_.ReplicaCopyStart("k", to_b, "a", true, false);
  ASSERT_TRUE(failed.ok()) << failed.status();
  EXPECT_EQ(ReplicaSegments(master_, "k"), std::vector<std::string>{"a"});
  EXPECT_TRUE(master_.ReplicaCopyEnd({{"k", failed->id, false}}).results[0].ok());
  Applied();
  EXPECT_EQ(ReplicaSegments(master_, "k"), std::vector<std::string>{"a"});
  // A copy whose tokens expired is not taken either.
  absl::StatusOr<MigrationPlan> late = master_.ReplicaCopyStart("k", to_b, "a", true, false);
  ASSERT_TRUE(late.ok()) << late.status();
  now_ += absl::Seconds(61);
  EXPECT_EQ(master_.ReplicaCopyEnd({{"k", late->id, true}}).results[0].code(),
            absl::StatusCode::kNotFound);
  Applied();
  EXPECT_EQ(ReplicaSegments(master_, "k"), std::vector<std::string>{"a"});
  // A made copy replaces the source's replica.
  absl::StatusOr<MigrationPlan> plan = master_.ReplicaCopyStart("k", to_b, "a", true, false);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_TRUE(master_.ReplicaCopyEnd({{"k", plan->id, true}}).results[0].ok());
  Applied();
  EXPECT_EQ(ReplicaSegments(master_, "k"), std::vector<std::string>{"b"});
  // The given-back copies' space returns once their tokens have expired.
  master_.ReclaimExpiredReservations();
  Applied();
  EXPECT_EQ(master_.GetClusterSummary().used_bytes, 1024u);
}

TEST_F(MasterTest, CopyAndMoveTasksAreRefusedWithMooncakesCodes) {
  for (const char* name : {"a", "b"}) {
    ASSERT_TRUE(master_.MountSegment(Segment(name, 4096)).ok());
  }
  std::vector<std::string> keys = {"k"};
  std::vector<uint64_t> sizes = {3000};
  PutStartResult put = std::move(
      master_.BatchPutStart(keys, sizes, {.preferred_segments = {"a"}}).value()[0]);
  ASSERT_TRUE(Commit("k", put.put_id).ok());
  auto code = [&](const std::string& key, std::vector<std::string> targets,
                  const std::string& source, bool dry_run) {
    return ToErrorCode(master_.ReplicaCopyStart(key, targets, source, !source.empty(), dry_run)
                           .status());
  };
  for (bool dry_run : {true, false}) {
    EXPECT_EQ(code("absent", {"b"}, "", dry_run), v1::OBJECT_NOT_FOUND);
    EXPECT_EQ(code("absent", {"nowhere"}, "", dry_run), v1::OBJECT_NOT_FOUND);
    EXPECT_EQ(code("k", {}, "", dry_run), v1::INVALID_PARAMS);
    EXPECT_EQ(code("k", {"b", "nowhere"}, "", dry_run), v1::INVALID_PARAMS);
    EXPECT_EQ(code("k", {"nowhere"}, "a", dry_run), v1::INVALID_PARAMS);
    EXPECT_EQ(code("k", {"b"}, "nowhere", dry_run), v1::INVALID_PARAMS);
    EXPECT_EQ(code("k", {"a"}, "a", dry_run), v1::INVALID_PARAMS);
    EXPECT_EQ(code("k", {"a"}, "b", dry_run), v1::INVALID_PARAMS);  // no replica on b
    EXPECT_EQ(code("", {"b"}, "", dry_run), v1::INVALID_KEY);
  }
  // A target with no room: NO_AVAILABLE_HANDLE, nothing reserved, the object intact.
  keys = {"filler"};
  put = std::move(master_.BatchPutStart(keys, sizes, {.preferred_segments = {"b"}}).value()[0]);
  ASSERT_TRUE(Commit("filler", put.put_id).ok());
  ASSERT_EQ(ReplicaSegments(master_, "filler"), std::vector<std::string>{"b"});
  EXPECT_EQ(code("k", {"b"}, "", true), v1::OK);
  EXPECT_EQ(code("k", {"b"}, "", false), v1::NO_AVAILABLE_HANDLE);
  EXPECT_EQ(code("k", {"b"}, "a", false), v1::NO_AVAILABLE_HANDLE);
  EXPECT_EQ(ReplicaSegments(master_, "k"), std::vector<std::string>{"a"});
  EXPECT_EQ(master_.GetClusterSummary().used_bytes, 2 * 3008u);  // 64-byte aligned
  // A draining target takes no new replica.
  ASSERT_TRUE(master_.DrainSegment("b").ok());
  EXPECT_EQ(code("k", {"b"}, "", true), v1::UNAVAILABLE_IN_CURRENT_STATUS);
}

TEST_F(MasterTest, SilentSegmentIsDeclaredDeadAfterTheTtlWithItsObjects) {
  ASSERT_TRUE(master_.MountSegment(Segment("a", 1 << 20)).ok());
  ASSERT_TRUE(master_.MountSegment(Segment("b", 1 << 20)).ok());
  std::vector<std::string> keys = {"both", "only"};
  std::vector<uint64_t> sizes = {100, 100};
  PutStartResult both = PutStart("both", 100, 2);
  ASSERT_TRUE(Commit("both", both.put_id).ok());
  PutStartResult only = PutStart("only", 100);
  ASSERT_TRUE(Commit("only", only.put_id).ok());
  std::string lost_segment = only.placements[0].segment_name;
  std::string kept_segment = lost_segment == "a" ? "b" : "a";

  now_ += absl::Seconds(8);
  EXPECT_TRUE(master_.Heartbeat(kept_segment, 1).known);
  EXPECT_FALSE(master_.Heartbeat("nobody", 1).known);
  EXPECT_FALSE(master_.Heartbeat(kept_segment, 2).known);  // wrong incarnation
  now_ += absl::Seconds(3);
  EXPECT_EQ(master_.ExpireSegments(), 1u);
  EXPECT_FALSE(master_.Heartbeat(lost_segment, 1).known);  // told to mount again

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
  SegmentInfo huge = Segment("a", ~uint64_t{0});
  EXPECT_EQ(master_.MountSegment(huge).code(), absl::StatusCode::kInvalidArgument);
  SegmentInfo bad_endpoint = Segment("a", 1 << 20);
  bad_endpoint.endpoint = "no-port";
  EXPECT_EQ(master_.MountSegment(bad_endpoint).code(), absl::StatusCode::kInvalidArgument);
  SegmentInfo long_name = Segment(std::string(5000, 'n'), 1 << 20);
  EXPECT_EQ(master_.MountSegment(long_name).code(), absl::StatusCode::kInvalidArgument);
  SegmentInfo busy_outside = Segment("a", 1 << 20);
  busy_outside.busy = {{(1 << 20) - 64, 128}};
  EXPECT_EQ(master_.MountSegment(busy_outside).code(), absl::StatusCode::kInvalidArgument);
  SegmentInfo busy_too_many = Segment("a", 1 << 20);
  busy_too_many.busy.assign(wire::kMaxBusyRanges + 1, wire::ByteRange{0, 64});
  EXPECT_EQ(master_.MountSegment(busy_too_many).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(master_.GetClusterSummary().segments.empty());
}

// --- Leases, pins, eviction, reclaim (issue: store semantics) ---

TEST_F(MasterTest, GetAndExistLeaseTheObjectAgainstRemoval) {
  ASSERT_TRUE(master_.MountSegment(Segment("a", 1 << 20)).ok());
  ASSERT_TRUE(Put("k", 100).ok());
  ASSERT_TRUE(Exists("k"));  // leases for lease_ttl (10 s)
  absl::Status leased = Remove("k");
  EXPECT_EQ(ToErrorCode(leased), v1::OBJECT_HAS_LEASE) << leased;
  EXPECT_EQ(master_.RemoveAll(false).results[0], 0u);
  EXPECT_EQ(master_.CountLeased(), 1u);
  now_ += absl::Seconds(11);
  EXPECT_EQ(master_.CountLeased(), 0u);
  EXPECT_TRUE(Remove("k").ok());

  ASSERT_TRUE(Put("k2", 100).ok());
  GetResult got = master_.BatchGetReplicaList({"k2"})[0];
  EXPECT_EQ(got.lease_expiry, now_ + absl::Seconds(10));
  EXPECT_TRUE(Remove("k2", /*force=*/true).ok());
}

TEST_F(MasterTest, APutLeasesItsObjectOnlyWithLeaseOnPut) {
  // By default (as Mooncake's master) a new object holds no lease: removable at once.
  ASSERT_TRUE(master_.MountSegment(Segment("a", 1 << 20)).ok());
  ASSERT_TRUE(Put("k", 100).ok());
  EXPECT_EQ(master_.CountLeased(), 0u);
  EXPECT_TRUE(Remove("k").ok());

  MasterOptions options = Options();
  options.lease_on_put = true;
  Master leasing(options);
  ASSERT_TRUE(leasing.MountSegment(Segment("b", 1 << 20)).ok());
  std::vector<std::string> keys = {"k"};
  std::vector<uint64_t> sizes = {100};
  PutStartResult started = std::move(leasing.BatchPutStart(keys, sizes, {}).value()[0]);
  ASSERT_TRUE(started.status.ok()) << started.status;
  now_ += absl::Seconds(3);  // the lease runs from the commit, not the reservation
  ASSERT_TRUE(leasing.BatchPutEnd({PutRef{"k", started.put_id}}).results[0].ok());
  EXPECT_EQ(leasing.CountLeased(), 1u);
  EXPECT_EQ(ToErrorCode(leasing.BatchRemove({"k"}, false).results[0]), v1::OBJECT_HAS_LEASE);
  EXPECT_EQ(leasing.RemoveAll(false).results[0], 0u);
  now_ += absl::Seconds(9);
  EXPECT_EQ(leasing.CountLeased(), 1u);
  now_ += absl::Seconds(2);
  EXPECT_EQ(leasing.CountLeased(), 0u);
  EXPECT_TRUE(leasing.BatchRemove({"k"}, false).results[0].ok());
}

TEST_F(MasterTest, ReadTokensExpireWithTheLease) {
  ASSERT_TRUE(master_.MountSegment(Segment("a", 1 << 20)).ok());
  ASSERT_TRUE(Put("k", 100).ok());
  GetResult got = master_.BatchGetReplicaList({"k"})[0];
  const PlacementView& p = got.replicas[0];
  wire::RequestHeader read{.opcode = wire::Opcode::kRead, .offset = p.offset, .length = p.length,
                           .token = *p.token};
  EXPECT_TRUE(wire::VerifyToken(secrets_["a"], read, now_ + absl::Seconds(9)).ok());
  EXPECT_FALSE(wire::VerifyToken(secrets_["a"], read, now_ + absl::Seconds(11)).ok());
}

TEST_F(MasterTest, FullPoolEvictsTheLeastRecentlyUsedToMakeRoom) {
  ASSERT_TRUE(master_.MountSegment(Segment("a", 64 << 10)).ok());
  for (int i = 0; i < 64; ++i) {
    ASSERT_TRUE(Put("k" + std::to_string(i), 1024).ok()) << i;
    now_ += absl::Seconds(1);
  }
  now_ += absl::Seconds(60);  // every lease has run out
  // Touch the oldest ones; they become the most recently used (and leased again).
  ASSERT_TRUE(Exists("k0"));
  ASSERT_TRUE(Exists("k1"));
  now_ += absl::Seconds(11);
  ASSERT_TRUE(Put("new", 1024).ok());  // pool is full: evicts to make room
  EXPECT_TRUE(Exists("k0"));
  EXPECT_TRUE(Exists("k1"));
  // 5% of 64 KiB is 3.2 KiB: the four least recently used went, in order.
  for (int i = 2; i <= 5; ++i) EXPECT_FALSE(Exists("k" + std::to_string(i))) << i;
  EXPECT_TRUE(Exists("k6"));
  EXPECT_TRUE(Exists("new"));
  EXPECT_TRUE(Exists("k63"));
  EXPECT_GT(master_.counters().evicted_objects.load(), 0u);
  EXPECT_EQ(master_.counters().evicted_bytes.load(), master_.counters().evicted_objects.load() * 1024);
}

// Reads by key pass the master by; the segments report the keys (HeartbeatRequest.keys_read).
TEST_F(MasterTest, KeysReadByKeyCountAsUsedForEviction) {
  ASSERT_TRUE(master_.MountSegment(Segment("a", 64 << 10)).ok());
  for (int i = 0; i < 64; ++i) {
    ASSERT_TRUE(Put("k" + std::to_string(i), 1024).ok()) << i;
    now_ += absl::Seconds(1);
  }
  now_ += absl::Seconds(60);  // every lease has run out
  SegmentId a = *master_.Heartbeat("a", 1).segment;
  ASSERT_TRUE(master_.MountSegment(Segment("b", 64 << 10)).ok());
  SegmentId b = *master_.Heartbeat("b", 1).segment;
  // Only a segment that holds the key can report it read.
  master_.TouchKeys(b, std::vector<std::string>{"k1", "k3"});
  master_.TouchKeys(a, std::vector<std::string>{"k0", "k2", "never-stored"});
  EXPECT_EQ(master_.CountLeased(), 0u);         // a use, not a lease
  ASSERT_TRUE(master_.DrainSegment("b").ok());  // "new" must go to the full "a"
  ASSERT_TRUE(Put("new", 1024).ok());           // pool is full: evicts the four least recently used
  for (int i : {1, 3, 4, 5}) EXPECT_FALSE(Exists("k" + std::to_string(i))) << i;
  for (int i : {0, 2, 6}) EXPECT_TRUE(Exists("k" + std::to_string(i))) << i;
}

TEST_F(MasterTest, EvictionNeverTouchesLeasedPinnedOrPendingObjects) {
  // 8 KiB pool: [hard][soft][plain][pending][leased][old][ free 2 KiB ]
  ASSERT_TRUE(master_.MountSegment(Segment("a", 8 << 10)).ok());
  ASSERT_TRUE(Put("hard", 1024, PinMode::kHard).ok());
  ASSERT_TRUE(Put("soft", 1024, PinMode::kSoft).ok());
  ASSERT_TRUE(Put("plain", 1024).ok());
  PutStartResult pending = PutStart("pending", 1024);
  ASSERT_TRUE(pending.status.ok());
  ASSERT_TRUE(Put("leased", 1024).ok());
  ASSERT_TRUE(Put("old", 1024).ok());
  ASSERT_TRUE(Exists("leased"));
  // 3 KiB: evicting "plain" and "old" makes room; soft pins stay while that is enough.
  ASSERT_TRUE(Put("big", 3 * 1024).ok());
  EXPECT_FALSE(Exists("plain"));
  EXPECT_FALSE(Exists("old"));
  EXPECT_TRUE(Exists("soft"));
  EXPECT_TRUE(Exists("hard"));
  EXPECT_TRUE(Exists("leased"));
  ASSERT_TRUE(Commit("pending", pending.put_id).ok());  // was never touched
  // (Exists leases what it finds: let those leases run out, then lease every unpinned one.)
  now_ += absl::Seconds(11);
  for (const char* key : {"pending", "big", "leased"}) ASSERT_TRUE(Exists(key)) << key;
  // Everything unpinned is leased now: the soft pin goes when nothing else can.
  absl::Status more = Put("more", 2048);
  ASSERT_TRUE(more.ok()) << more;
  EXPECT_FALSE(Exists("soft"));
  EXPECT_TRUE(Exists("hard"));
  ASSERT_TRUE(Exists("more"));
  // Nothing evictable is left: pressure, not an error.
  absl::Status no_room = Put("even-more", 2048);
  EXPECT_EQ(ToErrorCode(no_room), v1::NO_AVAILABLE_HANDLE) << no_room;
  EXPECT_TRUE(Exists("hard"));
}

TEST_F(MasterTest, HighWatermarkEvictsARatioOfTheCapacityPerRound) {
  ASSERT_TRUE(master_.MountSegment(Segment("a", 100 << 10)).ok());
  for (int i = 0; i < 97; ++i) ASSERT_TRUE(Put("k" + std::to_string(i), 1024).ok());
  ASSERT_TRUE(Exists("k0"));  // leased: the next oldest go instead
  uint64_t freed = master_.EvictIfAboveHighWatermark();  // 97% > 95%: frees 5% of 100 KiB
  EXPECT_GE(freed, 5u * 1024);
  EXPECT_LE(freed, 6u * 1024);
  EXPECT_EQ(master_.EvictIfAboveHighWatermark(), 0u);  // 91-92%: below the mark
  EXPECT_TRUE(Exists("k0"));
  for (int i = 1; i <= 5; ++i) EXPECT_FALSE(Exists("k" + std::to_string(i))) << i;
  EXPECT_TRUE(Exists("k7"));
  EXPECT_TRUE(Exists("k96"));
}

TEST_F(MasterTest, AbandonedReservationsAreReclaimedAfterThePutTimeout) {
  ASSERT_TRUE(master_.MountSegment(Segment("a", 1 << 20)).ok());
  PutStartResult early = PutStart("early", 1000);
  now_ += absl::Seconds(30);
  PutStartResult late = PutStart("late", 1000);
  now_ += absl::Seconds(31);  // early is 61 s old, late 31 s
  EXPECT_EQ(master_.ReclaimExpiredReservations(), 1u);
  EXPECT_EQ(Commit("early", early.put_id).code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(Commit("late", late.put_id).ok());
  EXPECT_EQ(master_.GetClusterSummary().used_bytes, 1024u);
  EXPECT_EQ(master_.counters().reclaimed_reservations.load(), 1u);
  // The key is free again for a new writer.
  EXPECT_TRUE(Put("early", 10).ok());
}

TEST_F(MasterTest, PreferredHostIsTriedFirst) {
  ASSERT_TRUE(master_.MountSegment(Segment("big", 4 << 20)).ok());
  ASSERT_TRUE(master_.MountSegment(Segment("small", 1 << 20)).ok());
  std::vector<std::string> keys = {"k"};
  std::vector<uint64_t> sizes = {100};
  PutStartResult result =
      master_.BatchPutStart(keys, sizes, {.preferred_host = "host-small"}).value()[0];
  EXPECT_EQ(result.placements[0].segment_name, "small");
}

TEST_F(MasterTest, KeysOfOneBatchSpreadOverSegments) {
  ASSERT_TRUE(master_.MountSegment(Segment("a", 1 << 20)).ok());
  ASSERT_TRUE(master_.MountSegment(Segment("b", 1 << 20)).ok());
  std::vector<std::string> keys;
  std::vector<uint64_t> sizes;
  for (int i = 0; i < 200; ++i) {
    keys.push_back("k" + std::to_string(i));
    sizes.push_back(4 << 10);
  }
  std::map<std::string, int> per_segment;
  std::vector<PutStartResult> results = master_.BatchPutStart(keys, sizes, {}).value();
  for (size_t i = 0; i < keys.size(); ++i) {
    const std::string& segment = results[i].placements[0].segment_name;
    per_segment[segment]++;
    EXPECT_EQ(segment, HomeOf(keys[i], {{"a", 1 << 20}, {"b", 1 << 20}})) << keys[i];
  }
  EXPECT_NEAR(per_segment["a"], 100, 30);
  EXPECT_NEAR(per_segment["b"], 100, 30);
}

TEST_F(MasterTest, DrainedSegmentTakesNothingNewAndLeavesWhenNothingIsLeased) {
  ASSERT_TRUE(master_.MountSegment(Segment("a", 1 << 20)).ok());
  ASSERT_TRUE(master_.MountSegment(Segment("b", 1 << 20)).ok());
  std::vector<std::string> keys = {"on-a"};
  std::vector<uint64_t> sizes = {100};
  PutStartResult both = PutStart("both", 100, 2);
  ASSERT_TRUE(Commit("both", both.put_id).ok());
  ASSERT_TRUE(master_.DrainSegment("a").ok());
  EXPECT_EQ(ToErrorCode(master_.DrainSegment("nobody")), v1::SEGMENT_NOT_FOUND);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(PutStart("new" + std::to_string(i), 100).placements[0].segment_name, "b");
  }
  ASSERT_TRUE(Exists("both"));  // leased now
  EXPECT_EQ(master_.FinishDrains(), 0u);
  now_ += absl::Seconds(11);
  EXPECT_EQ(master_.FinishDrains(), 1u);
  EXPECT_EQ(master_.GetClusterSummary().segments.size(), 1u);
  Master::HeartbeatReply reply = master_.Heartbeat("a", 1);
  EXPECT_FALSE(reply.known);
  EXPECT_TRUE(reply.drained);
  GetResult got = master_.BatchGetReplicaList({"both"})[0];
  ASSERT_TRUE(got.status.ok());
  ASSERT_EQ(got.replicas.size(), 1u);
  EXPECT_EQ(got.replicas[0].segment_name, "b");
}

TEST_F(MasterTest, MigratingDrainMovesObjectsToOtherSegmentsBeforeLeaving) {
  ASSERT_TRUE(master_.MountSegment(Segment("a", 1 << 20)).ok());
  for (int i = 0; i < 6; ++i) ASSERT_TRUE(Put("k" + std::to_string(i), 1000).ok());
  ASSERT_TRUE(master_.MountSegment(Segment("b", 1 << 20)).ok());
  EXPECT_EQ(master_.MigrateStart("a", 10, 1 << 20).status().code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(master_.DrainSegment("a", /*migrate=*/true).ok());
  // The mover has not called yet: the drain must not drop what it is about to copy.
  EXPECT_EQ(master_.FinishDrains(), 0u);

  // Batches of at most 4 objects; every copy goes from a to b, with tokens for both ranges.
  MigrateStartResult first = *master_.MigrateStart("a", 4, 1 << 20);
  ASSERT_EQ(first.migrations.size(), 4u);
  for (const MigrationPlan& plan : first.migrations) {
    EXPECT_EQ(plan.source.segment_name, "a");
    EXPECT_EQ(plan.destination.segment_name, "b");
    EXPECT_EQ(plan.size, 1000u);
    wire::RequestHeader write{.opcode = wire::Opcode::kWrite,
                              .offset = plan.destination.offset,
                              .length = 1000,
                              .token = *plan.destination.token};
    EXPECT_TRUE(wire::VerifyToken(secrets_["b"], write, now_).ok());
    wire::RequestHeader read{.opcode = wire::Opcode::kRead,
                             .offset = plan.source.offset,
                             .length = 1000,
                             .token = *plan.source.token};
    EXPECT_TRUE(wire::VerifyToken(secrets_["a"], read, now_).ok());
  }
  // Objects being copied are held: no unforced removal.
  EXPECT_EQ(ToErrorCode(Remove(first.migrations[0].key)), v1::OBJECT_HAS_LEASE);
  MigrateStartResult second = *master_.MigrateStart("a", 4, 1 << 20);
  EXPECT_EQ(second.migrations.size(), 2u);
  EXPECT_EQ(second.in_flight, 4u);

  // Three copies made, one failed (retried later), and the last two made.
  std::vector<MigrationRef> refs;
  for (size_t i = 0; i < 4; ++i) {
    refs.push_back({first.migrations[i].key, first.migrations[i].id, /*copied=*/i != 3});
  }
  for (const MigrationPlan& plan : second.migrations) refs.push_back({plan.key, plan.id, true});
  Durable<absl::Status> ended = master_.MigrateEnd(refs);
  for (const absl::Status& status : ended.results) EXPECT_TRUE(status.ok()) << status;
  // A copy reported twice, or under another id, is not known any more.
  EXPECT_EQ(master_.MigrateEnd({refs[0]}).results[0].code(), absl::StatusCode::kNotFound);

  MigrateStartResult retry = *master_.MigrateStart("a", 4, 1 << 20);
  ASSERT_EQ(retry.migrations.size(), 1u);
  EXPECT_EQ(retry.migrations[0].key, first.migrations[3].key);
  ASSERT_TRUE(master_.MigrateEnd({{retry.migrations[0].key, retry.migrations[0].id, true}})
                  .results[0]
                  .ok());
  MigrateStartResult done = *master_.MigrateStart("a", 4, 1 << 20);
  EXPECT_TRUE(done.migrations.empty());
  EXPECT_EQ(done.in_flight, 0u);
  EXPECT_EQ(done.unplaceable, 0u);

  EXPECT_EQ(master_.FinishDrains(), 1u);
  for (int i = 0; i < 6; ++i) {
    GetResult got = master_.BatchGetReplicaList({"k" + std::to_string(i)})[0];
    ASSERT_TRUE(got.status.ok()) << i;
    ASSERT_EQ(got.replicas.size(), 1u);
    EXPECT_EQ(got.replicas[0].segment_name, "b");
  }
  // The copies are b's space now, a's is gone with it; the failed copy's range stays taken
  // until its write token expired (a late writer cannot hit a new object).
  ClusterSummary summary = master_.GetClusterSummary();
  ASSERT_EQ(summary.segments.size(), 1u);
  EXPECT_EQ(summary.segments[0].replicas, 7u);
  now_ += master_.options().put_timeout + absl::Seconds(1);
  master_.ReclaimExpiredReservations();
  summary = master_.GetClusterSummary();
  EXPECT_EQ(summary.segments[0].replicas, 6u);
  EXPECT_EQ(summary.used_bytes, 6 * RangeAllocator::Rounded(1000));
}

TEST_F(MasterTest, MigrationsThatCannotBePlacedOrKeepFailingAreDroppedWithTheSegment) {
  ASSERT_TRUE(master_.MountSegment(Segment("a", 1 << 20)).ok());
  ASSERT_TRUE(Put("big", 600 << 10).ok());
  ASSERT_TRUE(Put("flaky", 1000).ok());
  ASSERT_TRUE(master_.MountSegment(Segment("b", 512 << 10)).ok());
  ASSERT_TRUE(master_.DrainSegment("a", /*migrate=*/true).ok());
  for (int attempt = 0; attempt < IndexShard::kMaxFailedMigrations; ++attempt) {
    MigrateStartResult started = *master_.MigrateStart("a", 10, 1 << 20);
    ASSERT_EQ(started.migrations.size(), 1u) << attempt;
    EXPECT_EQ(started.migrations[0].key, "flaky");
    EXPECT_EQ(started.unplaceable, 1u);  // "big" fits nowhere else
    master_.MigrateEnd({{"flaky", started.migrations[0].id, /*copied=*/false}});
  }
  MigrateStartResult done = *master_.MigrateStart("a", 10, 1 << 20);
  EXPECT_TRUE(done.migrations.empty());
  EXPECT_EQ(done.unplaceable, 2u);
  // The given-back copies' space returns to b once their tokens expired.
  now_ += master_.options().put_timeout + absl::Seconds(1);
  master_.ReclaimExpiredReservations();
  EXPECT_EQ(master_.FinishDrains(), 1u);
  EXPECT_FALSE(Exists("big"));
  EXPECT_FALSE(Exists("flaky"));
  EXPECT_EQ(master_.GetClusterSummary().used_bytes, 0u);
}

TEST_F(MasterTest, MigrationBatchesStayWithinTheirBytesButHoldAtLeastOneObject) {
  ASSERT_TRUE(master_.MountSegment(Segment("a", 1 << 20)).ok());
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(Put("k" + std::to_string(i), 1000).ok());
  ASSERT_TRUE(master_.MountSegment(Segment("b", 1 << 20)).ok());
  ASSERT_TRUE(master_.DrainSegment("a", /*migrate=*/true).ok());
  EXPECT_EQ(master_.MigrateStart("a", 10, 2500)->migrations.size(), 2u);
  EXPECT_EQ(master_.MigrateStart("a", 10, 10)->migrations.size(), 1u);
  EXPECT_EQ(master_.MigrateStart("a", 10, 1 << 20)->migrations.size(), 2u);
}

TEST_F(MasterTest, ASilentMoverLetsTheDrainFinishAfterThePutTimeout) {
  ASSERT_TRUE(master_.MountSegment(Segment("a", 1 << 20)).ok());
  ASSERT_TRUE(Put("k", 1000).ok());
  ASSERT_TRUE(master_.MountSegment(Segment("b", 1 << 20)).ok());
  ASSERT_TRUE(master_.DrainSegment("a", /*migrate=*/true).ok());
  MigrateStartResult started = *master_.MigrateStart("a", 10, 1 << 20);
  ASSERT_EQ(started.migrations.size(), 1u);
  now_ += master_.options().put_timeout - absl::Seconds(1);
  EXPECT_EQ(master_.FinishDrains(), 0u);
  now_ += absl::Seconds(2);
  // The copy came too late: not used; the drain finishes without it.
  EXPECT_EQ(master_.MigrateEnd({{"k", started.migrations[0].id, true}}).results[0].code(),
            absl::StatusCode::kNotFound);
  master_.ReclaimExpiredReservations();
  EXPECT_EQ(master_.FinishDrains(), 1u);
  EXPECT_FALSE(Exists("k"));
  EXPECT_EQ(master_.GetClusterSummary().used_bytes, 0u);
}

TEST_F(MasterTest, ManifestRecordsCommitsAndForgetsAndRebuildsTheIndex) {
  SegmentInfo info = Segment("a", 1 << 20);
  ASSERT_TRUE(master_.MountSegment(info).ok());
  auto id = master_.Heartbeat("a", 1).segment;
  ASSERT_TRUE(id.has_value());
  PutStartResult started = PutStart("k", 1000);
  Durable<absl::Status> ended = master_.BatchPutEnd({PutRef{"k", started.put_id, 0xabc}});
  ASSERT_TRUE(ended.results[0].ok());
  ASSERT_EQ(ended.ticket.waits.size(), 1u);
  bool durable = false;
  master_.manifest_sync().Wait(ended.ticket, now_ + absl::Seconds(1), [&](bool ok) { durable = ok; });
  EXPECT_FALSE(durable);
  ManifestSync::Batch batch = master_.manifest_sync().Sync(*id, 0, 100);
  ASSERT_EQ(batch.records.size(), 1u);
  EXPECT_EQ(batch.records[0].key, "k");
  EXPECT_EQ(batch.records[0].offset, started.placements[0].offset);
  EXPECT_EQ(batch.records[0].checksum, 0xabcu);
  master_.manifest_sync().Sync(*id, batch.last_seq, 100);  // the segment applied it
  EXPECT_TRUE(durable);

  // A new master learns the object from the segment's manifest.
  Master restarted(Options());
  info.restoring = true;
  ASSERT_TRUE(restarted.MountSegment(info).ok());
  std::vector<std::string> no_keys;
  std::vector<uint64_t> no_sizes;
  EXPECT_TRUE(restarted.BatchPutStart({"x"}, {std::vector<uint64_t>{10}}, {}).value()[0].status.code() ==
              absl::StatusCode::kResourceExhausted);  // restoring: takes nothing new yet
  std::vector<ManifestRecord> manifest = {batch.records[0],
                                          {ManifestRecord::Kind::kAdd, "overlap",
                                           batch.records[0].offset + 64, 10, 0, PinMode::kNone}};
  std::vector<std::string> refused = *restarted.RestoreManifest("a", 1, manifest);
  EXPECT_EQ(refused, std::vector<std::string>{"overlap"});
  ASSERT_TRUE(restarted.FinishRestore("a", 1).ok());
  GetResult got = restarted.BatchGetReplicaList({"k"})[0];
  ASSERT_TRUE(got.status.ok());
  EXPECT_EQ(got.checksum, 0xabcu);
  EXPECT_EQ(got.replicas[0].offset, started.placements[0].offset);
  EXPECT_EQ(restarted.GetClusterSummary().used_bytes, 1024u);
  // Its range is taken again: a new object goes elsewhere.
  PutStartResult next = restarted.BatchPutStart({"y"}, {std::vector<uint64_t>{10}}, {}).value()[0];
  ASSERT_TRUE(next.status.ok());
  EXPECT_NE(next.placements[0].offset, started.placements[0].offset);

  // Removing queues a forget record.
  ASSERT_TRUE(Remove("k", /*force=*/true).ok());
  batch = master_.manifest_sync().Sync(*id, batch.last_seq, 100);
  ASSERT_EQ(batch.records.size(), 1u);
  EXPECT_EQ(batch.records[0].kind, ManifestRecord::Kind::kForget);
}

TEST_F(MasterTest, ACommitTheSegmentRefusesFailsAndFreesItsRange) {
  SegmentInfo info = Segment("a", 1 << 20);
  ASSERT_TRUE(master_.MountSegment(info).ok());
  auto id = master_.Heartbeat("a", 1).segment;
  ASSERT_TRUE(id.has_value());
  PutStartResult bad = PutStart("bad", 1000);
  PutStartResult good = PutStart("good", 1000);
  Durable<absl::Status> ended = master_.BatchPutEnd(
      {PutRef{"bad", bad.put_id, 0xabc}, PutRef{"good", good.put_id, 0xdef}});
  ASSERT_TRUE(ended.results[0].ok() && ended.results[1].ok());
  bool durable = false;
  master_.manifest_sync().Wait(ended.ticket, now_ + absl::Seconds(1), [&](bool ok) {
    durable = ok;
    // The refusal is known before the waiters are released.
    absl::MutexLock lock(&ended.refusals->mu);
    EXPECT_EQ(ended.refusals->by_index.size(), 1u);
  });
  ManifestSync::Batch batch = master_.manifest_sync().Sync(*id, 0, 100);
  ASSERT_EQ(batch.records.size(), 2u);
  // The segment applied the second ADD and refused the first.
  uint64_t refused_seq = batch.last_seq - 1;
  batch = master_.manifest_sync().Sync(*id, batch.last_seq, 100, {refused_seq});
  EXPECT_TRUE(durable);
  {
    absl::MutexLock lock(&ended.refusals->mu);
    ASSERT_EQ(ended.refusals->by_index.count(0), 1u);
    EXPECT_EQ(ToErrorCode(ended.refusals->by_index[0]), v1::CHECKSUM_MISMATCH);
    EXPECT_EQ(ended.refusals->by_index.count(1), 0u);
  }
  EXPECT_EQ(master_.BatchGetReplicaList({"bad"})[0].status.code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(master_.BatchGetReplicaList({"good"})[0].status.ok());
  // The FORGET that ends the refused grant (reads too) frees the range once applied; it was
  // queued by the refusal, so the next heartbeat fetches it.
  batch = master_.manifest_sync().Sync(*id, batch.last_seq, 100);
  ASSERT_EQ(batch.records.size(), 1u);
  EXPECT_EQ(batch.records[0].kind, ManifestRecord::Kind::kForget);
  EXPECT_EQ(batch.records[0].key, "bad");
  EXPECT_EQ(master_.GetClusterSummary().used_bytes, 2048u);
  master_.manifest_sync().Sync(*id, batch.last_seq, 100);
  EXPECT_EQ(master_.GetClusterSummary().used_bytes, 1024u);
  // A refusal reported again (a retried heartbeat) changes nothing.
  master_.manifest_sync().Sync(*id, batch.last_seq, 100, {refused_seq});
  EXPECT_TRUE(master_.BatchGetReplicaList({"good"})[0].status.ok());
}

// A removal answered as not durable (its FORGET not yet applied) is retried: the retry
// answers as the removal does, OK with the same wait, not OBJECT_NOT_FOUND; once applied it
// is OK at once, and a removal answered as durable is forgotten (a later one is not found).
TEST_F(MasterTest, ARetriedRemovalThatWasNotDurableAnswersAsTheRemoval) {
  ASSERT_TRUE(master_.MountSegment(Segment("a", 1 << 20)).ok());
  SegmentId id = *master_.Heartbeat("a", 1).segment;
  ASSERT_TRUE(Put("k", 100).ok());
  Durable<absl::Status> removed = master_.BatchRemove({"k"}, /*force=*/false);
  ASSERT_TRUE(removed.results[0].ok());
  ASSERT_FALSE(removed.ticket.empty());
  EXPECT_FALSE(master_.manifest_sync().Applied(removed.ticket));
  // The segment has not applied the FORGET (control path cut): the retry waits as well.
  Durable<absl::Status> retried = master_.BatchRemove({"k"}, false);
  ASSERT_TRUE(retried.results[0].ok()) << retried.results[0];
  EXPECT_FALSE(retried.ticket.empty());
  EXPECT_FALSE(master_.manifest_sync().Applied(retried.ticket));
  EXPECT_EQ(master_.BatchGetReplicaList({"k"})[0].status.code(), absl::StatusCode::kNotFound);
  // Applied: a retry is OK with nothing left to wait for.
  master_.manifest_sync().Sync(id, std::numeric_limits<uint64_t>::max(), 0);
  retried = master_.BatchRemove({"k"}, false);
  ASSERT_TRUE(retried.results[0].ok());
  EXPECT_TRUE(master_.manifest_sync().Applied(retried.ticket));
  // Kept for retries until the window passes (not forgotten earlier by the sweep).
  EXPECT_EQ(master_.ForgetSettledRemovals(), 1u);
  now_ += Master::kRemovalRetryWindow;
  EXPECT_EQ(master_.ForgetSettledRemovals(), 0u);
  EXPECT_EQ(ToErrorCode(Remove("k")), v1::OBJECT_NOT_FOUND);

  // Answered as durable (SettleRemovals): forgotten at once; a key never stored is not found.
  ASSERT_TRUE(Put("j", 100).ok());
  removed = master_.BatchRemove({"j"}, false);
  master_.manifest_sync().Sync(id, std::numeric_limits<uint64_t>::max(), 0);
  master_.SettleRemovals({std::string("j")});
  EXPECT_EQ(ToErrorCode(Remove("j")), v1::OBJECT_NOT_FOUND);
  EXPECT_EQ(ToErrorCode(Remove("never")), v1::OBJECT_NOT_FOUND);
  // SettleRemovals leaves a removal not yet applied.
  ASSERT_TRUE(Put("m", 100).ok());
  removed = master_.BatchRemove({"m"}, false);
  master_.SettleRemovals({std::string("m")});
  EXPECT_TRUE(Remove("m").ok());
}

TEST_F(MasterTest, ClosingManifestSyncAnswersParkedPollsAndWaiters) {
  ASSERT_TRUE(master_.MountSegment(Segment("a", 1 << 20)).ok());
  SegmentId id = *master_.Heartbeat("a", 1).segment;
  bool answered = false;
  master_.manifest_sync().Poll(id, now_ + absl::Hours(1), [&] { answered = true; });
  PutStartResult started = PutStart("k", 10);
  // The commit queues a record, which answers the poll; a second poll parks.
  Durable<absl::Status> ended = master_.BatchPutEnd({PutRef{"k", started.put_id}});
  EXPECT_TRUE(answered);
  bool second = false, released = false, durable = true;
  master_.manifest_sync().Sync(id, 0, 0);
  master_.manifest_sync().Wait(ended.ticket, now_ + absl::Hours(1), [&](bool ok) {
    released = true;
    durable = ok;
  });
  ManifestSync::Batch batch = master_.manifest_sync().Sync(id, 0, 100);
  (void)batch;
  master_.manifest_sync().Close();
  EXPECT_TRUE(released);
  EXPECT_FALSE(durable);
  // After closing, nothing parks: a poll is answered at once.
  master_.manifest_sync().Poll(id, now_ + absl::Hours(1), [&] { second = true; });
  EXPECT_TRUE(second);
}

// A segment hears of a batch's commits in one answer to its heartbeat poll, not of the first
// commit alone and of the rest one round trip later: the poll is answered once, after the
// batch's last record is queued.
TEST_F(MasterTest, ABatchOfCommitsGoesOutInOnePollAnswer) {
  ASSERT_TRUE(master_.MountSegment(Segment("a", 1 << 20)).ok());
  SegmentId id = *master_.Heartbeat("a", 1).segment;
  std::vector<std::string> keys;
  std::vector<uint64_t> sizes;
  for (int i = 0; i < 8; ++i) {
    keys.push_back(absl::StrCat("k", i));
    sizes.push_back(100);
  }
  std::vector<PutStartResult> started = master_.BatchPutStart(keys, sizes, {}).value();
  std::vector<PutRef> puts;
  for (size_t i = 0; i < keys.size(); ++i) puts.push_back(PutRef{keys[i], started[i].put_id});
  // What the segment would be sent when its poll is answered.
  std::optional<size_t> told;
  master_.manifest_sync().Poll(id, now_ + absl::Hours(1), [&] {
    told = master_.manifest_sync().Sync(id, 0, 1000).records.size();
  });
  Durable<absl::Status> ended = master_.BatchPutEnd(puts);
  ASSERT_TRUE(told.has_value());
  EXPECT_EQ(*told, keys.size());
  EXPECT_EQ(WaitNow(ended.ticket), std::nullopt);
  // Acknowledged (as a heartbeat does on arrival): the waiters go, and the next poll parks
  // (nothing newer to send), instead of being answered at once and empty.
  master_.manifest_sync().Sync(id, keys.size(), 0);
  EXPECT_EQ(WaitNow(ended.ticket), std::optional<bool>(true));
  bool answered = false;
  master_.manifest_sync().Poll(id, now_ + absl::Hours(1), [&] { answered = true; });
  EXPECT_FALSE(answered);
  master_.manifest_sync().Close();
  EXPECT_TRUE(answered);
}

// A commit's ticket is waited on after BatchPutEnd returns (the gRPC handler's next step).
// A segment mounted afresh in between took the unapplied ADD with it: the commit must not be
// answered as durable (the object is dropped with the segment's old replicas, and its
// manifest, reported again, does not hold it).
TEST_F(MasterTest, ACommitWhoseSegmentWentBeforeTheWaitIsNotDurable) {
  ASSERT_TRUE(master_.MountSegment(Segment("a", 1 << 20)).ok());
  PutStartResult started = PutStart("k", 10);
  Durable<absl::Status> ended = master_.BatchPutEnd({PutRef{"k", started.put_id}});
  ASSERT_TRUE(ended.results[0].ok());
  ASSERT_FALSE(ended.ticket.empty());
  ASSERT_TRUE(master_.MountSegment(Segment("a", 1 << 20, /*incarnation=*/2)).ok());
  std::optional<bool> durable = WaitNow(ended.ticket);
  ASSERT_TRUE(durable.has_value());
  EXPECT_FALSE(*durable);
}

// The same, applied before the segment went: durable (it is in the manifest it reports).
TEST_F(MasterTest, ACommitAppliedBeforeItsSegmentWentIsDurable) {
  ASSERT_TRUE(master_.MountSegment(Segment("a", 1 << 20)).ok());
  PutStartResult started = PutStart("k", 10);
  Durable<absl::Status> ended = master_.BatchPutEnd({PutRef{"k", started.put_id}});
  ASSERT_TRUE(ended.results[0].ok());
  Applied();
  ASSERT_TRUE(master_.MountSegment(Segment("a", 1 << 20, /*incarnation=*/2)).ok());
  std::optional<bool> durable = WaitNow(ended.ticket);
  ASSERT_TRUE(durable.has_value());
  EXPECT_TRUE(*durable);
}

// A record appended for a segment already gone (its replica looked up just before the
// segment went) reaches no manifest: its ticket fails, it does not come back empty.
TEST_F(MasterTest, ARecordForASegmentAlreadyGoneFailsItsTicket) {
  ASSERT_TRUE(master_.MountSegment(Segment("a", 1 << 20)).ok());
  SegmentId old_id = *master_.Heartbeat("a", 1).segment;
  ASSERT_TRUE(master_.MountSegment(Segment("a", 1 << 20, /*incarnation=*/2)).ok());
  ManifestSync::Ticket ticket;
  master_.manifest_sync().Append(
      old_id, ManifestRecord{.kind = ManifestRecord::Kind::kAdd, .key = "k", .size = 10},
      &ticket);
  ASSERT_FALSE(ticket.empty());
  std::optional<bool> durable = WaitNow(ticket);
  ASSERT_TRUE(durable.has_value());
  EXPECT_FALSE(*durable);
}

// After Close, a wait on a record not applied is answered at once, as not durable.
TEST_F(MasterTest, AWaitAfterCloseIsNotDurable) {
  ASSERT_TRUE(master_.MountSegment(Segment("a", 1 << 20)).ok());
  PutStartResult started = PutStart("k", 10);
  Durable<absl::Status> ended = master_.BatchPutEnd({PutRef{"k", started.put_id}});
  master_.manifest_sync().Close();
  std::optional<bool> durable = WaitNow(ended.ticket);
  ASSERT_TRUE(durable.has_value());
  EXPECT_FALSE(*durable);
}

TEST_F(MasterTest, EmbeddedSegmentsKeepNoManifest) {
  SegmentInfo info = Segment("e", 1 << 20);
  info.embedded = true;
  ASSERT_TRUE(master_.MountSegment(info).ok());
  PutStartResult started = PutStart("k", 10);
  EXPECT_TRUE(master_.BatchPutEnd({PutRef{"k", started.put_id}}).ticket.empty());
}

// An embedded segment has no heartbeat: its busy ranges are asked for as each grant ends
// (before the range is freed) and every second (RefreshEmbeddedBusy).
TEST_F(MasterTest, EmbeddedSegmentsBusyRangesAreHeldUntilNoLongerBusy) {
  SegmentInfo info = Segment("e", 1 << 20);
  info.embedded = true;
  std::vector<wire::ByteRange> busy;
  std::optional<uint64_t> late_grant;
  info.apply_record = [&](const ManifestRecord&) {
    if (late_grant) busy = {{*late_grant, 4096}};  // its writer is still copying
  };
  info.busy_ranges = [&] { return busy; };
  ASSERT_TRUE(master_.MountSegment(info).ok());
  PutStartResult late = PutStart("late", 4096);
  late_grant = late.placements[0].offset;
  ASSERT_TRUE(master_.BatchPutRevoke({PutRef{"late", late.put_id}})[0].ok());
  EXPECT_EQ(master_.GetClusterSummary().segments[0].busy_bytes, 4096u);
  late_grant.reset();
  PutStartResult next = PutStart("next", 4096);
  EXPECT_NE(next.placements[0].offset, late.placements[0].offset);
  // The writer is done: the next refresh lets the range go.
  busy.clear();
  master_.RefreshEmbeddedBusy();
  EXPECT_EQ(master_.GetClusterSummary().segments[0].busy_bytes, 0u);
  PutStartResult again = PutStart("again", 4096);
  EXPECT_EQ(again.placements[0].offset, late.placements[0].offset);
}

}  // namespace
}  // namespace kvpool::master

namespace kvpool::master {
namespace {

class GrantFenceTest : public ::testing::Test {
 protected:
  GrantFenceTest() {
    SegmentInfo info;
    info.name = "a";
    info.host = "h";
    info.endpoint = "a:1";
    info.size = 1 << 20;
    info.incarnation = 1;
    info.token_secret = wire::NewCapabilitySecret();
    EXPECT_TRUE(master_.MountSegment(info).ok());
    id_ = *master_.Heartbeat("a", 1).segment;
  }
  PutStartResult Start(const std::string& key, const std::string& owner = "") {
    std::vector<std::string> keys = {key};
    std::vector<uint64_t> sizes = {4096};
    return master_.BatchPutStart(keys, sizes, {.owner = owner}).value()[0];
  }
  // A segment "r" (1 MiB) mounting with a manifest to report (RestoreManifest).
  static SegmentInfo RestoringSegment() {
    SegmentInfo info;
    info.name = "r";
    info.endpoint = "r:1";
    info.size = 1 << 20;
    info.incarnation = 2;
    info.token_secret = wire::NewCapabilitySecret();
    info.restoring = true;
    return info;
  }
  // What the segment is told, applied and acknowledged.
  std::vector<ManifestRecord> Apply() {
    ManifestSync::Batch batch = master_.manifest_sync().Sync(id_, 0, 1000);
    master_.manifest_sync().Sync(id_, batch.last_seq, 0);
    return batch.records;
  }

  Master master_;
  SegmentId id_ = 0;
};

TEST_F(GrantFenceTest, ARevokedRangeIsReusedOnlyOnceTheSegmentEndedItsGrant) {
  PutStartResult first = Start("first");
  ASSERT_TRUE(first.status.ok());
  ASSERT_TRUE(master_.BatchPutRevoke({PutRef{"first", first.put_id}})[0].ok());
  // Its write token could still land bytes: the range is not handed out yet.
  PutStartResult second = Start("second");
  EXPECT_NE(second.placements[0].offset, first.placements[0].offset);
  std::vector<ManifestRecord> told = Apply();
  ASSERT_EQ(told.size(), 1u);
  EXPECT_EQ(told[0].kind, ManifestRecord::Kind::kForget);
  EXPECT_EQ(told[0].grant, wire::TokenGrant(*first.placements[0].token));
  EXPECT_NE(told[0].grant, wire::TokenGrant(*second.placements[0].token));
  PutStartResult third = Start("third");
  EXPECT_EQ(third.placements[0].offset, first.placements[0].offset);
}

TEST_F(GrantFenceTest, ACommitEndsTheWriteGrantAndIsDurableOnlyWhenApplied) {
  PutStartResult put = Start("k");
  Durable<absl::Status> ended = master_.BatchPutEnd({PutRef{"k", put.put_id}});
  ASSERT_TRUE(ended.results[0].ok());
  std::optional<bool> durable;
  master_.manifest_sync().Wait(ended.ticket, absl::Now() + absl::Hours(1),
                               [&](bool ok) { durable = ok; });
  EXPECT_FALSE(durable.has_value());
  std::vector<ManifestRecord> told = Apply();
  ASSERT_EQ(told.size(), 1u);
  EXPECT_EQ(told[0].kind, ManifestRecord::Kind::kAdd);
  EXPECT_EQ(told[0].grant, wire::TokenGrant(*put.placements[0].token));
  EXPECT_EQ(durable, std::optional<bool>(true));

  // A commit whose segment goes away before applying it is not durable.
  PutStartResult lost = Start("lost");
  ended = master_.BatchPutEnd({PutRef{"lost", lost.put_id}});
  durable.reset();
  master_.manifest_sync().Wait(ended.ticket, absl::Now() + absl::Hours(1),
                               [&](bool ok) { durable = ok; });
  ASSERT_TRUE(master_.UnmountSegment("a", 1).ok());
  EXPECT_EQ(durable, std::optional<bool>(false));
}

TEST_F(GrantFenceTest, PutIdsAreUnpredictableAndTiedToTheCallerThatAsked) {
  PutStartResult a = Start("a", "ipv4:10.0.0.1");
  PutStartResult b = Start("b", "ipv4:10.0.0.1");
  EXPECT_GT(a.put_id > b.put_id ? a.put_id - b.put_id : b.put_id - a.put_id, 1000u);
  EXPECT_EQ(master_.BatchPutRevoke({PutRef{"a", a.put_id, 0, "ipv4:10.0.0.2"}})[0].code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(master_.BatchPutEnd({PutRef{"a", a.put_id, 0, "ipv4:10.0.0.2"}}).results[0].code(),
            absl::StatusCode::kNotFound);
  EXPECT_TRUE(master_.BatchPutEnd({PutRef{"a", a.put_id, 0, "ipv4:10.0.0.1"}}).results[0].ok());
}

TEST_F(GrantFenceTest, RestoredRecordsOutsideThePoolOrOfSizeZeroAreRefused) {
  ASSERT_TRUE(master_.UnmountSegment("a", 1).ok());
  SegmentInfo info = RestoringSegment();
  ASSERT_TRUE(master_.MountSegment(info).ok());
  std::vector<ManifestRecord> records = {
      {.key = "ok", .offset = 0, .size = 100},
      {.key = "zero", .offset = 4096, .size = 0},
      {.key = "outside", .offset = (1 << 20) - 64, .size = 128},
      {.key = "wraps", .offset = ~uint64_t{0} - 10, .size = 100},
      {.key = "huge", .offset = 0, .size = ~uint64_t{0}},
      {.key = "", .offset = 8192, .size = 10},
  };
  absl::StatusOr<std::vector<std::string>> refused = master_.RestoreManifest("r", 2, records);
  ASSERT_TRUE(refused.ok());
  EXPECT_EQ(*refused, (std::vector<std::string>{"zero", "outside", "wraps", "huge", ""}));
  EXPECT_TRUE(*master_.BatchExist({"ok"})[0]);
}

// --- Busy ranges: what the segment holds for a late shared-memory write ---

// A revoked reservation whose shared-memory writer is still copying: the segment reports
// its range busy with the heartbeat that acknowledges the FORGET, so the range goes from
// the reservation to the busy set without ever being free, and no put lands there until a
// report no longer lists it.
TEST_F(GrantFenceTest, ARangeReportedBusyIsNotHandedOutUntilNoLongerReported) {
  PutStartResult late = Start("late");
  const uint64_t busy_at = late.placements[0].offset;
  ASSERT_TRUE(master_.BatchPutRevoke({PutRef{"late", late.put_id}})[0].ok());
  ManifestSync::Batch told = master_.manifest_sync().Sync(id_, 0, 1000);
  ASSERT_EQ(told.records.size(), 1u);
  // The next heartbeat: busy ranges first, then the acknowledgement.
  ASSERT_TRUE(master_.ReportBusyRanges(id_, std::vector<wire::ByteRange>{{busy_at, 4096}}).ok());
  master_.manifest_sync().Sync(id_, told.last_seq, 0);
  ClusterSummary summary = master_.GetClusterSummary();
  EXPECT_EQ(summary.used_bytes, 0u);
  ASSERT_EQ(summary.segments.size(), 1u);
  EXPECT_EQ(summary.segments[0].busy_bytes, 4096u);
  // Many puts: none placed over [busy_at, +4096).
  for (int i = 0; i < 100; ++i) {
    PutStartResult put = Start("k" + std::to_string(i));
    ASSERT_TRUE(put.status.ok()) << i;
    uint64_t at = put.placements[0].offset;
    EXPECT_TRUE(at + 4096 <= busy_at || busy_at + 4096 <= at) << i << " placed at " << at;
    ASSERT_TRUE(master_.BatchPutRevoke({PutRef{"k" + std::to_string(i), put.put_id}})[0].ok());
    Apply();  // the same busy report stands
  }
  // A report without it: the range serves again (best fit would take it first anyway).
  ASSERT_TRUE(master_.ReportBusyRanges(id_, {}).ok());
  EXPECT_EQ(master_.GetClusterSummary().segments[0].busy_bytes, 0u);
  PutStartResult again = Start("again");
  EXPECT_EQ(again.placements[0].offset, busy_at);
}

TEST_F(GrantFenceTest, BadBusyReportsAreRefusedAndChangeNothing) {
  ASSERT_TRUE(master_.ReportBusyRanges(id_, std::vector<wire::ByteRange>{{0, 8192}}).ok());
  EXPECT_EQ(master_.ReportBusyRanges(id_, std::vector<wire::ByteRange>{{1 << 20, 64}}).code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<wire::ByteRange> too_many(wire::kMaxBusyRanges + 1, wire::ByteRange{0, 64});
  EXPECT_EQ(master_.ReportBusyRanges(id_, too_many).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(master_.GetClusterSummary().segments[0].busy_bytes, 8192u);
  EXPECT_EQ(master_.ReportBusyRanges(id_ + 1, {}).code(), absl::StatusCode::kNotFound);
}

// After a master restart (or a fail-over) the segment's mount carries its busy ranges; with a
// manifest to report they are held once it is restored, so its objects are placed first.
TEST_F(GrantFenceTest, BusyRangesOfAMountAreHeldOnceTheManifestIsRestored) {
  ASSERT_TRUE(master_.UnmountSegment("a", 1).ok());
  SegmentInfo info = RestoringSegment();
  info.busy = {{8192, 4096}};
  ASSERT_TRUE(master_.MountSegment(info).ok());
  EXPECT_EQ(master_.GetClusterSummary().segments[0].busy_bytes, 0u);
  std::vector<ManifestRecord> records = {{.key = "kept", .offset = 0, .size = 8192}};
  ASSERT_TRUE(master_.RestoreManifest("r", 2, records).value().empty());
  ASSERT_TRUE(master_.FinishRestore("r", 2).ok());
  EXPECT_EQ(master_.GetClusterSummary().segments[0].busy_bytes, 4096u);
  std::vector<std::string> keys = {"next"};
  std::vector<uint64_t> sizes = {4096};
  PutStartResult next = master_.BatchPutStart(keys, sizes, {}).value()[0];
  ASSERT_TRUE(next.status.ok());
  EXPECT_EQ(next.placements[0].offset, 12288u);

  // Without a manifest they are held from the mount on.
  SegmentInfo fresh = info;
  fresh.name = "s";
  fresh.endpoint = "s:1";
  fresh.restoring = false;
  fresh.busy = {{0, 4096}};
  ASSERT_TRUE(master_.MountSegment(fresh).ok());
  uint64_t held = 0;
  for (const SegmentSummary& s : master_.GetClusterSummary().segments) {
    if (s.name == "s") held = s.busy_bytes;
  }
  EXPECT_EQ(held, 4096u);
}

}  // namespace
}  // namespace kvpool::master
