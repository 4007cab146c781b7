// A pool of real processes on loopback: kvpool-master with two kvpool-segment daemons, driven
// through the C++ client. Checks contents byte for byte.

#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "client/tcp_transport.h"
#include "gtest/gtest.h"
#include "kvpool/client.h"
#include "kvpool/v1/master.grpc.pb.h"
#include "proto/channel.h"
#include "proto/error_codes.h"
#include "tests/harness/cluster.h"
#include "tests/harness/values.h"

namespace kvpool {
namespace {

using testing::MasterProcess;
using testing::SegmentProcess;

// Cuts [0, size) into `parts` pieces of uneven sizes (some may be empty).
std::vector<size_t> Cuts(size_t size, int parts, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<size_t> cuts = {0, size};
  for (int i = 1; i < parts; ++i) cuts.push_back(size == 0 ? 0 : rng() % size);
  std::sort(cuts.begin(), cuts.end());
  return cuts;
}

std::unique_ptr<Client> Connect(const std::string& master) {
  ClientOptions options;
  options.master_address = master;
  options.rpc_timeout = absl::Seconds(3);
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Create(options);
  EXPECT_TRUE(client.ok()) << client.status();
  return client.ok() ? std::move(*client) : nullptr;
}

class PoolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<MasterProcess> master = testing::StartMaster({"--embedded-segment-size=0"});
    ASSERT_TRUE(master.ok()) << master.status();
    master_ = std::move(*master);
    // 100 MiB each: the 118 MiB of the round-trip test cannot all go to one segment, whichever
    // segment each key's hash makes its home (2 of 512 cases on segments of 160 MiB).
    for (int i = 0; i < 2; ++i) {
      absl::StatusOr<SegmentProcess> segment = testing::StartSegment(master_.grpc, "100MiB");
      ASSERT_TRUE(segment.ok()) << segment.status();
      segments_.push_back(std::move(*segment));
    }
    client_ = Connect(master_.grpc);
    ASSERT_NE(client_, nullptr);
  }

  // Puts `value` gathered from `parts` buffers; reads it back scattered over a different cut.
  void RoundTrip(const std::string& key, const std::string& value, int parts) {
    std::vector<size_t> in = Cuts(value.size(), parts, static_cast<uint32_t>(value.size()));
    std::vector<ConstBuffer> gather;
    for (size_t i = 0; i + 1 < in.size(); ++i) {
      gather.push_back({value.data() + in[i], in[i + 1] - in[i]});
    }
    ASSERT_TRUE(client_->Put(key, gather).ok()) << key;

    std::string back(value.size() + 17, '\xEE');  // room to spare: must stay untouched
    std::vector<size_t> out = Cuts(back.size(), parts + 1, static_cast<uint32_t>(value.size() + 1));
    std::vector<MutableBuffer> scatter;
    for (size_t i = 0; i + 1 < out.size(); ++i) {
      scatter.push_back({back.data() + out[i], out[i + 1] - out[i]});
    }
    absl::StatusOr<uint64_t> read = client_->Get(key, scatter);
    ASSERT_TRUE(read.ok()) << key << ": " << read.status();
    EXPECT_EQ(*read, value.size());
    EXPECT_TRUE(back.compare(0, value.size(), value) == 0) << key << " came back different";
    EXPECT_EQ(back.substr(value.size()), std::string(17, '\xEE')) << "wrote past the object";
  }

  MasterProcess master_;
  std::vector<SegmentProcess> segments_;
  std::unique_ptr<Client> client_;
};

TEST_F(PoolTest, ValuesFromOneByteTo64MiBRoundTripAcrossTwoSegments) {
  const std::vector<size_t> sizes = {1,       7,       4096,     65537,    (1 << 20) + 3,
                                     4 << 20, 16 << 20, 33 << 20, 64 << 20};
  for (size_t i = 0; i < sizes.size(); ++i) {
    RoundTrip("size-" + std::to_string(sizes[i]), testing::RandomValue(sizes[i], i), 1 + i % 5);
  }
  absl::StatusOr<ClusterStatus> status = client_->GetClusterStatus();
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(status->objects, sizes.size());
  ASSERT_EQ(status->segments.size(), 2u);
  for (const SegmentStatus& segment : status->segments) {
    EXPECT_GT(segment.used_bytes, 0u) << segment.name << " holds nothing: placement is lopsided";
  }
  // Everything is still there, byte for byte, after all the other writes.
  for (size_t i = 0; i < sizes.size(); ++i) {
    absl::StatusOr<std::string> value = client_->Get("size-" + std::to_string(sizes[i]));
    ASSERT_TRUE(value.ok());
    EXPECT_TRUE(*value == testing::RandomValue(sizes[i], i));
  }
}

TEST_F(PoolTest, BatchesOfManyKeysExistAndRemove) {
  constexpr int kKeys = 100;
  std::vector<std::string> values;
  std::vector<PutItem> puts;
  std::vector<std::string> keys;
  for (int i = 0; i < kKeys; ++i) {
    values.push_back(testing::RandomValue(64 << 10, 1000 + i));
    keys.push_back("model@tp_rank:0@pcp0@dcp0@pp_rank:0@" + std::to_string(i));
  }
  for (int i = 0; i < kKeys; ++i) {
    // Two halves, as a K and a V buffer would be.
    puts.push_back({keys[i], {{values[i].data(), 32 << 10}, {values[i].data() + (32 << 10), 32 << 10}}});
  }
  for (const absl::Status& status : client_->BatchPut(puts)) ASSERT_TRUE(status.ok()) << status;

  std::vector<std::string> back(kKeys, std::string(64 << 10, '\0'));
  std::vector<GetItem> gets;
  for (int i = 0; i < kKeys; ++i) gets.push_back({keys[i], {{back[i].data(), back[i].size()}}});
  std::vector<absl::StatusOr<uint64_t>> read = client_->BatchGet(gets);
  for (int i = 0; i < kKeys; ++i) {
    ASSERT_TRUE(read[i].ok()) << read[i].status();
    EXPECT_EQ(back[i], values[i]) << keys[i];
  }

  // Reads by key leave no lease at the master (the segment cuts a read whose object goes); an
  // exist leases every object it finds: removing needs force while the leases run.
  for (const absl::StatusOr<bool>& found : client_->BatchExist(keys)) ASSERT_TRUE(*found);
  std::vector<std::string> removed(keys.begin(), keys.begin() + kKeys / 2);
  for (const absl::Status& status : client_->BatchRemove(removed)) {
    EXPECT_EQ(ToErrorCode(status), v1::OBJECT_HAS_LEASE) << status;
  }
  for (const absl::Status& status : client_->BatchRemove(removed, /*force=*/true)) {
    EXPECT_TRUE(status.ok()) << status;
  }
  std::vector<absl::StatusOr<bool>> exists = client_->BatchExist(keys);
  for (int i = 0; i < kKeys; ++i) {
    ASSERT_TRUE(exists[i].ok());
    EXPECT_EQ(*exists[i], i >= kKeys / 2) << keys[i];
  }
  EXPECT_EQ(ToErrorCode(client_->Remove(keys[0], true)), v1::OBJECT_NOT_FOUND);
  EXPECT_EQ(*client_->RemoveAll(), 0u);  // all leased
  EXPECT_EQ(*client_->RemoveAll(/*force=*/true), static_cast<uint64_t>(kKeys / 2));
  EXPECT_EQ(client_->GetClusterStatus()->used_bytes, 0u);
}

TEST_F(PoolTest, MissingKeysAreNotFound) {
  absl::StatusOr<std::string> value = client_->Get("never-stored");
  EXPECT_EQ(value.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(ToErrorCode(value.status()), v1::OBJECT_NOT_FOUND);
  EXPECT_EQ(ToErrorCode(client_->Size("never-stored").status()), -704);
  EXPECT_FALSE(*client_->Exists("never-stored"));
}

TEST_F(PoolTest, SecondPutOfAKeyIsAlreadyExistsAndChangesNothing) {
  ASSERT_TRUE(client_->Put("dup", "first").ok());
  absl::Status again = client_->Put("dup", "other");
  EXPECT_EQ(ToErrorCode(again), v1::OBJECT_ALREADY_EXISTS);
  EXPECT_EQ(*client_->Get("dup"), "first");
}

TEST_F(PoolTest, BuffersSmallerThanTheObjectAreBufferOverflow) {
  ASSERT_TRUE(client_->Put("big", testing::RandomValue(1000, 3)).ok());
  std::string small(999, '\0');
  MutableBuffer buffer{small.data(), small.size()};
  absl::StatusOr<uint64_t> read = client_->Get("big", absl::MakeConstSpan(&buffer, 1));
  EXPECT_EQ(ToErrorCode(read.status()), v1::BUFFER_OVERFLOW);
  EXPECT_EQ(small, std::string(999, '\0'));
}

TEST_F(PoolTest, AbandonedPutIsNeverVisible) {
  // Phase 1 and 2 of a put, by hand, then the writer walks away.
  auto stub = v1::MasterService::NewStub(MakeMasterChannel(master_.grpc));
  v1::BatchPutStartRequest start;
  start.add_keys("abandoned");
  start.add_sizes(4096);
  v1::BatchPutStartResponse reserved;
  grpc::ClientContext context;
  ASSERT_TRUE(stub->BatchPutStart(&context, start, &reserved).ok());
  ASSERT_EQ(reserved.results(0).code(), 0);
  const v1::Placement& placement = reserved.results(0).placements(0);
  std::string value = testing::RandomValue(4096, 9);
  client::TcpTransport transport({});
  client::TransferOp write{.opcode = wire::Opcode::kWrite,
                           .endpoint = placement.endpoint(),
                           .offset = placement.offset(),
                           .length = placement.length(),
                           .iov = {{value.data(), value.size()}}};
  std::memcpy(write.token.data(), placement.token().data(), write.token.size());
  transport.Execute(absl::MakeSpan(&write, 1), absl::Now() + absl::Seconds(5));
  ASSERT_TRUE(write.status.ok()) << write.status;

  EXPECT_FALSE(*client_->Exists("abandoned"));
  EXPECT_EQ(ToErrorCode(client_->Get("abandoned").status()), v1::OBJECT_NOT_FOUND);
  // Someone else writing the same key is told it is in flight, and writes nothing.
  EXPECT_EQ(ToErrorCode(client_->Put("abandoned", "x")), v1::OBJECT_ALREADY_EXISTS);
  EXPECT_EQ(client_->GetClusterStatus()->pending_objects, 1u);
}

// BatchGetReplicaList's compact answer (compact_placements): each segment once in the answer's
// table, and every replica resolved through it to the segment, range and token of the full
// answer (the token read back over TCP); without the flag the answer is as it was. The client
// asks in the compact form and hands the same locations up.
TEST_F(PoolTest, CompactLookupNamesEachSegmentOnceAndResolvesEveryReplica) {
  std::vector<std::string> keys;
  std::vector<std::string> values;
  std::vector<int> replicas;
  for (int i = 0; i < 12; ++i) {
    keys.push_back("compact-" + std::to_string(i));
    values.push_back(testing::RandomValue(1000 + 517 * i, 100 + i));
    replicas.push_back(i % 2 == 0 ? 2 : 1);
    ASSERT_TRUE(client_
                    ->Put(keys.back(), values.back(),
                          PutOptions{.replicas = static_cast<uint32_t>(replicas.back())})
                    .ok())
        << keys.back();
  }
  for (size_t at : {size_t{3}, size_t{13}}) {
    keys.insert(keys.begin() + at, "absent-" + std::to_string(at));
    values.insert(values.begin() + at, "");
    replicas.insert(replicas.begin() + at, 0);
  }
  auto stub = v1::MasterService::NewStub(MakeMasterChannel(master_.grpc));
  auto ask = [&](bool compact, bool tokens) {
    v1::BatchGetReplicaListRequest request;
    for (const std::string& key : keys) request.add_keys(key);
    request.set_compact_placements(compact);
    request.set_without_tokens(!tokens);
    v1::BatchGetReplicaListResponse answer;
    grpc::ClientContext context;
    EXPECT_TRUE(stub->BatchGetReplicaList(&context, request, &answer).ok());
    EXPECT_EQ(answer.results_size(), static_cast<int>(keys.size()));
    return answer;
  };
  const v1::BatchGetReplicaListResponse full = ask(false, true);
  const v1::BatchGetReplicaListResponse compact = ask(true, true);
  const v1::BatchGetReplicaListResponse bare = ask(true, false);
  ASSERT_EQ(full.results_size(), static_cast<int>(keys.size()));
  ASSERT_EQ(compact.results_size(), static_cast<int>(keys.size()));
  ASSERT_EQ(bare.results_size(), static_cast<int>(keys.size()));

  // The table: both segments, once each, as the cluster lists them.
  EXPECT_EQ(full.segments_size(), 0);
  ASSERT_EQ(compact.segments_size(), 2);
  EXPECT_NE(compact.segments(0).name(), compact.segments(1).name());
  absl::StatusOr<ClusterStatus> status = client_->GetClusterStatus();
  ASSERT_TRUE(status.ok()) << status.status();
  for (const v1::SegmentRef& segment : compact.segments()) {
    auto listed = std::find_if(status->segments.begin(), status->segments.end(),
                               [&](const SegmentStatus& s) { return s.name == segment.name(); });
    ASSERT_NE(listed, status->segments.end()) << segment.name();
    EXPECT_EQ(segment.endpoint(), listed->endpoint);
    EXPECT_EQ(segment.host(), listed->host);
    EXPECT_NE(segment.incarnation(), 0u);
  }
  ASSERT_EQ(bare.segments_size(), 2);

  client::TcpTransport transport({});
  for (size_t i = 0; i < keys.size(); ++i) {
    SCOPED_TRACE(keys[i]);
    const v1::GetResult& old = full.results(static_cast<int>(i));
    const v1::GetResult& got = compact.results(static_cast<int>(i));
    EXPECT_TRUE(old.compact_replicas().empty());
    EXPECT_TRUE(got.replicas().empty());
    if (replicas[i] == 0) {
      EXPECT_EQ(old.code(), v1::OBJECT_NOT_FOUND);
      EXPECT_EQ(got.code(), v1::OBJECT_NOT_FOUND);
      EXPECT_TRUE(old.replicas().empty());
      EXPECT_TRUE(got.compact_replicas().empty());
      continue;
    }
    ASSERT_EQ(old.code(), v1::OK);
    ASSERT_EQ(got.code(), v1::OK);
    EXPECT_EQ(got.size(), values[i].size());
    EXPECT_EQ(got.checksum(), old.checksum());
    EXPECT_GT(got.lease_ttl_ms(), 0u);
    ASSERT_EQ(old.replicas_size(), replicas[i]);
    ASSERT_EQ(got.compact_replicas_size(), replicas[i]);
    ASSERT_EQ(bare.results(static_cast<int>(i)).compact_replicas_size(), replicas[i]);
    for (int j = 0; j < replicas[i]; ++j) {
      const v1::Placement& want = old.replicas(j);
      const v1::CompactPlacement& placement = got.compact_replicas(j);
      ASSERT_LT(placement.segment(), 2u);
      const v1::SegmentRef& segment = compact.segments(static_cast<int>(placement.segment()));
      EXPECT_EQ(segment.name(), want.segment_name());
      EXPECT_EQ(segment.endpoint(), want.endpoint());
      EXPECT_EQ(segment.host(), want.host());
      EXPECT_EQ(segment.incarnation(), want.incarnation());
      EXPECT_EQ(placement.offset(), want.offset());
      EXPECT_EQ(placement.length(), values[i].size());
      EXPECT_EQ(placement.length(), want.length());
      ASSERT_EQ(placement.token().size(), 32u);
      // Without tokens: the same replica, its token left out.
      const v1::CompactPlacement& untokened = bare.results(static_cast<int>(i)).compact_replicas(j);
      EXPECT_EQ(bare.segments(static_cast<int>(untokened.segment())).name(), segment.name());
      EXPECT_EQ(untokened.offset(), placement.offset());
      EXPECT_TRUE(untokened.token().empty());
      // The token is this range's: the segment serves the value's bytes for it.
      std::string back(values[i].size(), '\0');
      client::TransferOp read{.opcode = wire::Opcode::kRead,
                              .endpoint = segment.endpoint(),
                              .offset = placement.offset(),
                              .length = placement.length(),
                              .iov = {{back.data(), back.size()}}};
      std::memcpy(read.token.data(), placement.token().data(), read.token.size());
      transport.Execute(absl::MakeSpan(&read, 1), absl::Now() + absl::Seconds(5));
      ASSERT_TRUE(read.status.ok()) << read.status;
      EXPECT_TRUE(back == values[i]) << "replica " << j << " came back different";
    }
  }

  // Through the client, which asks in the compact form: the same locations.
  std::vector<absl::StatusOr<std::vector<ReplicaLocation>>> located =
      client_->BatchReplicaLocations(keys);
  ASSERT_EQ(located.size(), keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    SCOPED_TRACE(keys[i]);
    if (replicas[i] == 0) {
      EXPECT_EQ(ToErrorCode(located[i].status()), v1::OBJECT_NOT_FOUND);
      continue;
    }
    ASSERT_TRUE(located[i].ok()) << located[i].status();
    ASSERT_EQ(located[i]->size(), static_cast<size_t>(replicas[i]));
    for (int j = 0; j < replicas[i]; ++j) {
      const v1::Placement& want = full.results(static_cast<int>(i)).replicas(j);
      EXPECT_EQ((*located[i])[j].segment_name, want.segment_name());
      EXPECT_EQ((*located[i])[j].endpoint, want.endpoint());
      EXPECT_EQ((*located[i])[j].offset, want.offset());
      EXPECT_EQ((*located[i])[j].length, want.length());
    }
  }
  // And the mapped pools' bytes (the segments' host and incarnation checked against the
  // client's mappings).
  absl::Time lease_expiry;
  std::vector<absl::StatusOr<LocalValue>> local = client_->BatchGetLocal(keys, &lease_expiry);
  ASSERT_EQ(local.size(), keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    SCOPED_TRACE(keys[i]);
    if (replicas[i] == 0) {
      EXPECT_EQ(ToErrorCode(local[i].status()), v1::OBJECT_NOT_FOUND);
      continue;
    }
    ASSERT_TRUE(local[i].ok()) << local[i].status();
    ASSERT_EQ(local[i]->size, values[i].size());
    EXPECT_TRUE(std::string(reinterpret_cast<const char*>(local[i]->data), local[i]->size) ==
                values[i]);
  }
}

TEST_F(PoolTest, ReplicasLiveOnDistinctSegmentsAndSurviveLosingOne) {
  std::string value = testing::RandomValue(1 << 20, 11);
  ASSERT_TRUE(client_->Put("replicated", value, PutOptions{.replicas = 2}).ok());
  absl::StatusOr<ClusterStatus> status = client_->GetClusterStatus();
  for (const SegmentStatus& segment : status->segments) EXPECT_EQ(segment.replicas, 1u);

  segments_[0].process->Signal(SIGKILL);
  segments_[0].process->Wait();
  // The master has not noticed yet; the client falls over to the live replica by itself.
  absl::StatusOr<std::string> back = client_->Get("replicated");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(*back == value);
}

TEST(ShutdownTest, SigtermStopsMasterAndSegmentPromptlyAndCleanly) {
  absl::StatusOr<MasterProcess> master = testing::StartMaster({"--embedded-segment-size=8MiB"});
  ASSERT_TRUE(master.ok()) << master.status();
  absl::StatusOr<SegmentProcess> segment = testing::StartSegment(master->grpc, "8MiB");
  ASSERT_TRUE(segment.ok()) << segment.status();
  std::unique_ptr<Client> client = Connect(master->grpc);
  ASSERT_TRUE(client->Put("k", "v").ok());
  absl::SleepFor(absl::Milliseconds(300));  // a heartbeat is parked on the master now
  for (testing::Process* process : {segment->process.get(), master->process.get()}) {
    absl::Time signalled = absl::Now();
    process->Signal(SIGTERM);
    int status = process->Wait();
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
    EXPECT_LT(absl::Now() - signalled, absl::Seconds(5));
    if (process == segment->process.get()) {
      // It unmounted on its way out (its parked heartbeat was cancelled, not the unmount).
      absl::StatusOr<ClusterStatus> status_after = client->GetClusterStatus();
      ASSERT_TRUE(status_after.ok()) << status_after.status();
      EXPECT_EQ(status_after->segments.size(), 1u);
    }
  }
}

TEST(MasterRestartTest, ClientAndSegmentFindARestartedMaster) {
  absl::StatusOr<MasterProcess> master = testing::StartMaster({"--embedded-segment-size=0"});
  ASSERT_TRUE(master.ok()) << master.status();
  std::string address = master->grpc;
  absl::StatusOr<SegmentProcess> segment = testing::StartSegment(address, "32MiB");
  ASSERT_TRUE(segment.ok()) << segment.status();
  std::unique_ptr<Client> client = Connect(address);
  ASSERT_TRUE(client->Put("before", "1").ok());

  master->process->Signal(SIGKILL);
  master->process->Wait();
  absl::Status down = client->Put("during", "2");
  EXPECT_EQ(ToErrorCode(down), v1::RPC_FAIL) << down;

  master = testing::StartMaster({"--embedded-segment-size=0"}, address);
  ASSERT_TRUE(master.ok()) << master.status();
  // The segment mounts again by itself; the same client object works again.
  ASSERT_TRUE(segment->process->WaitForLine("kvpool-segment mounted", absl::Seconds(10)).ok());
  absl::Status after = client->Put("after", "3");
  for (int i = 0; i < 50 && !after.ok(); ++i) {
    absl::SleepFor(absl::Milliseconds(100));  // gRPC's reconnect backoff is at most 1 s
    after = client->Put("after", "3");
  }
  ASSERT_TRUE(after.ok()) << after;
  EXPECT_EQ(*client->Get("after"), "3");
}

}  // namespace
}  // namespace kvpool
