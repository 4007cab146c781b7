// A master that answers nonsense (sizes no pool has, placements that disagree with the
// object, too few results): the client answers each with a clear error and never aborts.
// The master is a stand-in gRPC server: it is the thing under attack's peer, not the thing
// under test.

#include <memory>
#include <string>

#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "kvpool/client.h"
#include "kvpool/v1/master.grpc.pb.h"

namespace kvpool {
namespace {

class LyingMaster final : public v1::MasterService::CallbackService {
 public:
  uint64_t size = 0;
  uint64_t placement_length = 0;
  int results = 1;

  grpc::ServerUnaryReactor* GetClusterStatus(grpc::CallbackServerContext* context,
                                             const v1::GetClusterStatusRequest*,
                                             v1::GetClusterStatusResponse*) override {
    auto* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

  grpc::ServerUnaryReactor* BatchGetReplicaList(grpc::CallbackServerContext* context,
                                                const v1::BatchGetReplicaListRequest*,
                                                v1::BatchGetReplicaListResponse* response) override {
    for (int i = 0; i < results; ++i) {
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
    options.master_address = "127.0.0.1:" + std::to_string(port);
    options.transport = TransportKind::kTcp;
    options.cache_locations = false;
    options.transfer_timeout = absl::Seconds(2);
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Create(options);
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = std::move(*client);
  }
  void TearDown() override { server_->Shutdown(); }

  LyingMaster master_;
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

}  // namespace
}  // namespace kvpool
