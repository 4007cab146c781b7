// A master that answers nonsense (sizes no pool has, placements that disagree with the
// object, too few results): the client answers each with a clear error and never aborts.
// The master is a stand-in gRPC server: it is the thing under attack's peer, not the thing
// under test.

#include <atomic>
#include <memory>
#include <optional>
#include <string>

#include "client/master_client.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "kvpool/client.h"
#include "kvpool/v1/master.grpc.pb.h"
#include "proto/master_locator.h"

namespace kvpool {
namespace {

class LyingMaster final : public v1::MasterService::CallbackService {
 public:
  uint64_t size = 0;
  uint64_t placement_length = 0;
  int results = 1;
  // Answer this instead, when set (a compact answer, see CompactAnswer below).
  std::optional<v1::BatchGetReplicaListResponse> answer;
  // Whether the last request asked for compact placements.
  std::atomic<bool> asked_compact{false};

  grpc::ServerUnaryReactor* GetClusterStatus(grpc::CallbackServerContext* context,
                                             const v1::GetClusterStatusRequest*,
                                             v1::GetClusterStatusResponse*) override {
    auto* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

  grpc::ServerUnaryReactor* BatchGetReplicaList(
      grpc::CallbackServerContext* context, const v1::BatchGetReplicaListRequest* request,
      v1::BatchGetReplicaListResponse* response) override {
    asked_compact = request->compact_placements();
    if (answer) *response = *answer;
    for (int i = 0; !answer && i < results; ++i) {
      v1::GetResult* result = response->add_results();
      result->set_code(0);
      result->set_size(size);
      result->set_lease_ttl_ms(10000);
      v1::Placement* replica = result->add_replicas();
      replica->set_segment_name("s");
      replica->set_endpoint("127.0.0.1:1");
      replica->set_offset(0);
      replica->set_length(placement_length);
      replica->set_token(std::string(32, 't'));
    }
    auto* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
};

class BadMasterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&master_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(port, 0);
    ClientOptions options;
    master_address_ = "127.0.0.1:" + std::to_string(port);
    options.master_address = master_address_;
    options.transport = TransportKind::kTcp;
    options.cache_locations = false;
    options.transfer_timeout = absl::Seconds(2);
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Create(options);
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = std::move(*client);
  }
  void TearDown() override { server_->Shutdown(); }

  LyingMaster master_;
  std::string master_address_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<Client> client_;
};

TEST_F(BadMasterTest, AHugeSizeIsAnErrorNotAnAbort) {
  master_.size = master_.placement_length = uint64_t{1} << 60;
  absl::StatusOr<std::string> value = client_->Get("k");
  ASSERT_FALSE(value.ok());
  EXPECT_EQ(value.status().code(), absl::StatusCode::kInternal) << value.status();
  EXPECT_NE(value.status().message().find("size"), absl::string_view::npos) << value.status();
}

TEST_F(BadMasterTest, PlacementsThatDisagreeWithTheSizeAreAnError) {
  master_.size = 100;
  master_.placement_length = uint64_t{1} << 40;
  absl::StatusOr<std::string> value = client_->Get("k");
  ASSERT_FALSE(value.ok());
  EXPECT_NE(value.status().message().find("placed"), absl::string_view::npos) << value.status();
  char buffer[128];
  MutableBuffer into{buffer, sizeof(buffer)};
  absl::StatusOr<uint64_t> read = client_->Get("k", absl::MakeConstSpan(&into, 1));
  EXPECT_FALSE(read.ok());
}

TEST_F(BadMasterTest, TooManyResultsAreAnError) {
  master_.size = master_.placement_length = 100;
  master_.results = 3;
  EXPECT_FALSE(client_->Get("k").ok());
}

// A compact answer (BatchGetReplicaListRequest.compact_placements) for keys "a" (two
// replicas, on segments 1 and 0), "b" (one, on segment 1) and "gone" (not found), with
// read tokens whose bytes say which replica they are for.
v1::BatchGetReplicaListResponse CompactAnswer() {
  v1::BatchGetReplicaListResponse answer;
  for (int i = 0; i < 2; ++i) {
    v1::SegmentRef* segment = answer.add_segments();
    segment->set_name("seg-" + std::to_string(i));
    segment->set_endpoint("10.0.0." + std::to_string(i) + ":5006" + std::to_string(i));
    segment->set_host("host-" + std::to_string(i) + ".example.com");
    segment->set_incarnation(1000 + i);
  }
  auto add = [&answer](uint64_t size, std::vector<std::pair<uint32_t, uint64_t>> replicas) {
    v1::GetResult* result = answer.add_results();
    result->set_size(size);
    result->set_checksum(size * 7);
    result->set_lease_ttl_ms(10000);
    for (const auto& [segment, offset] : replicas) {
      v1::CompactPlacement* replica = result->add_compact_replicas();
      replica->set_segment(segment);
      replica->set_offset(offset);
      replica->set_length(size);
      replica->set_token(std::string(32, static_cast<char>('a' + offset % 26)));
    }
  };
  add(100, {{1, 4096}, {0, 8192}});
  add(7, {{1, 1}});
  v1::GetResult* gone = answer.add_results();
  gone->set_code(v1::OBJECT_NOT_FOUND);
  gone->set_message("no such key");
  return answer;
}

class CompactAnswerTest : public BadMasterTest {
 protected:
  absl::StatusOr<std::vector<client::Location>> Locate() {
    absl::StatusOr<std::unique_ptr<MasterLocator>> locator = MasterLocator::Create(master_address_);
    if (!locator.ok()) return locator.status();
    std::unique_ptr<client::MasterClient> master =
        client::MakeGrpcMasterClient(std::move(*locator), absl::Seconds(5));
    const std::vector<std::string> keys = {"a", "b", "gone"};
    return master->BatchGetReplicaList(keys, {});
  }
};

TEST_F(CompactAnswerTest, EachReplicaGetsItsSegmentFromTheTable) {
  master_.answer = CompactAnswer();
  absl::StatusOr<std::vector<client::Location>> located = Locate();
  ASSERT_TRUE(located.ok()) << located.status();
  EXPECT_TRUE(master_.asked_compact);
  ASSERT_EQ(located->size(), 3u);

  const client::Location& a = (*located)[0];
  ASSERT_TRUE(a.status.ok()) << a.status;
  EXPECT_EQ(a.size, 100u);
  EXPECT_EQ(a.checksum, 700u);
  EXPECT_EQ(a.lease, absl::Seconds(10));
  ASSERT_EQ(a.replicas.size(), 2u);
  EXPECT_EQ(a.replicas[0].segment_name, "seg-1");
  EXPECT_EQ(a.replicas[0].endpoint, "10.0.0.1:50061");
  EXPECT_EQ(a.replicas[0].host, "host-1.example.com");
  EXPECT_EQ(a.replicas[0].incarnation, 1001u);
  EXPECT_EQ(a.replicas[0].offset, 4096u);
  EXPECT_EQ(a.replicas[0].length, 100u);
  EXPECT_EQ(std::string(a.replicas[0].token.begin(), a.replicas[0].token.end()),
            std::string(32, static_cast<char>('a' + 4096 % 26)));
  EXPECT_EQ(a.replicas[1].segment_name, "seg-0");
  EXPECT_EQ(a.replicas[1].endpoint, "10.0.0.0:50060");
  EXPECT_EQ(a.replicas[1].host, "host-0.example.com");
  EXPECT_EQ(a.replicas[1].incarnation, 1000u);
  EXPECT_EQ(a.replicas[1].offset, 8192u);
  EXPECT_EQ(a.replicas[1].length, 100u);
  EXPECT_EQ(std::string(a.replicas[1].token.begin(), a.replicas[1].token.end()),
            std::string(32, static_cast<char>('a' + 8192 % 26)));

  const client::Location& b = (*located)[1];
  ASSERT_TRUE(b.status.ok()) << b.status;
  ASSERT_EQ(b.replicas.size(), 1u);
  EXPECT_EQ(b.replicas[0].segment_name, "seg-1");
  EXPECT_EQ(b.replicas[0].endpoint, "10.0.0.1:50061");
  EXPECT_EQ(b.replicas[0].host, "host-1.example.com");
  EXPECT_EQ(b.replicas[0].incarnation, 1001u);
  EXPECT_EQ(b.replicas[0].offset, 1u);
  EXPECT_EQ(b.replicas[0].length, 7u);

  const client::Location& gone = (*located)[2];
  EXPECT_EQ(gone.status.code(), absl::StatusCode::kNotFound) << gone.status;
  EXPECT_TRUE(gone.replicas.empty());
}

TEST_F(CompactAnswerTest, ASegmentPastTheTableIsAnErrorForThatKeyOnly) {
  v1::BatchGetReplicaListResponse answer = CompactAnswer();
  answer.mutable_results(1)->mutable_compact_replicas(0)->set_segment(2);
  master_.answer = answer;
  absl::StatusOr<std::vector<client::Location>> located = Locate();
  ASSERT_TRUE(located.ok()) << located.status();
  EXPECT_TRUE((*located)[0].status.ok()) << (*located)[0].status;
  EXPECT_EQ((*located)[1].status.code(), absl::StatusCode::kInternal) << (*located)[1].status;
  EXPECT_NE((*located)[1].status.message().find("table"), absl::string_view::npos);
  EXPECT_TRUE((*located)[1].replicas.empty());
}

TEST_F(CompactAnswerTest, ALengthOtherThanTheSizeIsAnError) {
  v1::BatchGetReplicaListResponse answer = CompactAnswer();
  answer.mutable_results(0)->mutable_compact_replicas(1)->set_length(99);
  master_.answer = answer;
  absl::StatusOr<std::vector<client::Location>> located = Locate();
  ASSERT_TRUE(located.ok()) << located.status();
  EXPECT_EQ((*located)[0].status.code(), absl::StatusCode::kInternal) << (*located)[0].status;
  EXPECT_TRUE((*located)[0].replicas.empty());
  EXPECT_TRUE((*located)[1].status.ok()) << (*located)[1].status;
}

TEST_F(CompactAnswerTest, AMasterFromBeforeAnswersFullPlacementsWhichAreReadAsBefore) {
  // The stand-in's default answer ignores compact_placements, as a master from before does.
  master_.size = master_.placement_length = 100;
  master_.results = 3;
  absl::StatusOr<std::vector<client::Location>> located = Locate();
  ASSERT_TRUE(located.ok()) << located.status();
  EXPECT_TRUE(master_.asked_compact);
  for (const client::Location& location : *located) {
    ASSERT_TRUE(location.status.ok()) << location.status;
    ASSERT_EQ(location.replicas.size(), 1u);
    EXPECT_EQ(location.replicas[0].segment_name, "s");
    EXPECT_EQ(location.replicas[0].endpoint, "127.0.0.1:1");
    EXPECT_EQ(location.replicas[0].length, 100u);
  }
}

}  // namespace
}  // namespace kvpool
