// Store semantics against real processes: dedup races, eviction under leases and pins,
// pressure, segments killed mid-transfer, master restarts, corruption, drains.

#include <signal.h>
#include <sys/wait.h>

#include <atomic>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "kvpool/client.h"
#include "kvpool/v1/master.grpc.pb.h"
#include "proto/channel.h"
#include "proto/error_codes.h"
#include "tests/harness/cluster.h"
#include "tests/harness/eventually.h"
#include "tests/harness/values.h"
#include "tests/harness/http_get.h"

namespace kvpool {
namespace {

using testing::Eventually;
using testing::MasterProcess;
using testing::SegmentProcess;

std::unique_ptr<Client> Connect(const std::string& master, bool verify = false) {
  ClientOptions options;
  options.master_address = master;
  options.rpc_timeout = absl::Seconds(3);
  options.transfer_timeout = absl::Seconds(5);
  options.verify_checksums = verify;
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Create(options);
  EXPECT_TRUE(client.ok()) << client.status();
  return client.ok() ? std::move(*client) : nullptr;
}

TEST(DedupTest, ConcurrentWritersOfOneKeyExactlyOneWins) {
  absl::StatusOr<MasterProcess> master = testing::StartMaster({"--embedded-segment-size=64MiB"});
  ASSERT_TRUE(master.ok()) << master.status();
  constexpr int kWriters = 8;
  std::vector<std::unique_ptr<Client>> clients;
  for (int i = 0; i < kWriters; ++i) clients.push_back(Connect(master->grpc));
  for (int round = 0; round < 20; ++round) {
    std::string key = "race-" + std::to_string(round);
    std::vector<absl::Status> results(kWriters);
    std::atomic<bool> go{false};
    std::vector<std::thread> threads;
    for (int i = 0; i < kWriters; ++i) {
      threads.emplace_back([&, i] {
        while (!go.load()) {
        }
        results[i] = clients[i]->Put(key, testing::RandomValue(256 << 10, round * 100 + i));
      });
    }
    go = true;
    for (std::thread& thread : threads) thread.join();
    int winners = 0;
    int winner = -1;
    for (int i = 0; i < kWriters; ++i) {
      if (results[i].ok()) {
        ++winners;
        winner = i;
      } else {
        EXPECT_EQ(ToErrorCode(results[i]), v1::OBJECT_ALREADY_EXISTS) << results[i];
      }
    }
    ASSERT_EQ(winners, 1) << "round " << round;
    absl::StatusOr<std::string> stored = clients[0]->Get(key, {.verify_checksum = true});
    ASSERT_TRUE(stored.ok()) << stored.status();
    EXPECT_TRUE(*stored == testing::RandomValue(256 << 10, round * 100 + winner)) << "round " << round;
  }
}

TEST(EvictionTest, FullPoolEvictsWhileLeasedAndPinnedObjectsSurvive) {
  // 4 MiB pool of 256 KiB objects: 16 fit.
  absl::StatusOr<MasterProcess> master = testing::StartMaster({"--embedded-segment-size=4MiB"});
  ASSERT_TRUE(master.ok()) << master.status();
  std::unique_ptr<Client> client = Connect(master->grpc);
  const size_t kSize = 256 << 10;
  ASSERT_TRUE(client->Put("hard", testing::RandomValue(kSize, 1), {.pin = PinMode::kHard}).ok());
  ASSERT_TRUE(client->Put("soft", testing::RandomValue(kSize, 2), {.pin = PinMode::kSoft}).ok());
  for (int i = 0; i < 14; ++i) {
    ASSERT_TRUE(client->Put("old-" + std::to_string(i), testing::RandomValue(kSize, 10 + i)).ok());
  }
  absl::StatusOr<std::string> leased = client->Get("old-0");  // leased now
  ASSERT_TRUE(leased.ok());
  // The pool is full; these must evict unpinned, unleased objects (oldest first).
  for (int i = 0; i < 8; ++i) {
    absl::Status put = client->Put("new-" + std::to_string(i), testing::RandomValue(kSize, 100 + i));
    ASSERT_TRUE(put.ok()) << i << ": " << put;
  }
  std::vector<std::string> keys = {"hard", "soft", "old-0", "old-1", "new-7"};
  std::vector<absl::StatusOr<bool>> exists = client->BatchExist(keys);
  EXPECT_TRUE(*exists[0]) << "hard pin evicted";
  EXPECT_TRUE(*exists[1]) << "soft pin evicted while unpinned objects could go";
  EXPECT_TRUE(*exists[2]) << "leased object evicted";
  EXPECT_FALSE(*exists[3]) << "the least recently used object survived";
  EXPECT_TRUE(*exists[4]);
  EXPECT_TRUE(*client->Get("hard") == testing::RandomValue(kSize, 1));
  EXPECT_TRUE(*client->Get("old-0") == testing::RandomValue(kSize, 10));
  absl::StatusOr<ClusterStatus> status = client->GetClusterStatus();
  EXPECT_GE(status->evicted_objects, 6u);
  EXPECT_EQ(status->evicted_bytes % kSize, 0u);
  EXPECT_EQ(status->hard_pinned_objects, 1u);
}

TEST(PressureTest, PoolOfLeasedObjectsAnswersNoAvailableHandleForWhatDoesNotFit) {
  // No eviction rounds: the batch below fills the pool to 100%, past the 95% high-water mark,
  // and a round would evict one of its unleased new objects before the test reads it back.
  absl::StatusOr<MasterProcess> master = testing::StartMaster(
      {"--embedded-segment-size=1MiB", "--lease-ttl=30s", "--eviction-high-watermark=1"});
  ASSERT_TRUE(master.ok()) << master.status();
  std::unique_ptr<Client> client = Connect(master->grpc);
  std::vector<std::string> held;
  for (int i = 0; i < 12; ++i) {
    held.push_back("held-" + std::to_string(i));
    ASSERT_TRUE(client->Put(held.back(), testing::RandomValue(64 << 10, i)).ok());
  }
  for (const absl::StatusOr<bool>& e : client->BatchExist(held)) ASSERT_TRUE(*e);  // leases
  // 256 KiB are free: a batch of eight 64 KiB values gets four OKs and four -200s.
  std::vector<std::string> values;
  std::vector<PutItem> items;
  for (int i = 0; i < 8; ++i) values.push_back(testing::RandomValue(64 << 10, 100 + i));
  for (int i = 0; i < 8; ++i) {
    items.push_back({"more-" + std::to_string(i), {{values[i].data(), values[i].size()}}});
  }
  std::vector<absl::Status> results = client->BatchPut(items);
  int ok = 0, pressure = 0;
  for (const absl::Status& result : results) {
    if (result.ok()) ++ok;
    if (ToErrorCode(result) == v1::NO_AVAILABLE_HANDLE) ++pressure;
  }
  EXPECT_EQ(ok, 4);
  EXPECT_EQ(pressure, 4);
  for (int i = 0; i < 8; ++i) {
    if (results[i].ok()) {
      EXPECT_TRUE(*client->Get(items[i].key) == values[i]);
    }
  }
}

TEST(ReservationTest, AbandonedReservationIsReclaimedAfterThePutTimeout) {
  absl::StatusOr<MasterProcess> master =
      testing::StartMaster({"--embedded-segment-size=8MiB", "--put-timeout=1s"});
  ASSERT_TRUE(master.ok()) << master.status();
  auto stub = v1::MasterService::NewStub(MakeMasterChannel(master->grpc));
  v1::BatchPutStartRequest start;
  start.add_keys("abandoned");
  start.add_sizes(1 << 20);
  v1::BatchPutStartResponse reserved;
  grpc::ClientContext context;
  ASSERT_TRUE(stub->BatchPutStart(&context, start, &reserved).ok());
  ASSERT_EQ(reserved.results(0).code(), 0);
  std::unique_ptr<Client> client = Connect(master->grpc);
  EXPECT_EQ(client->GetClusterStatus()->pending_objects, 1u);
  ASSERT_TRUE(Eventually([&] { return client->GetClusterStatus()->pending_objects == 0; },
                         absl::Seconds(5)));
  absl::StatusOr<ClusterStatus> status = client->GetClusterStatus();
  EXPECT_EQ(status->used_bytes, 0u);
  EXPECT_EQ(status->reclaimed_reservations, 1u);
  // The late writer can no longer commit; the key is free for someone else.
  v1::BatchPutEndRequest end;
  v1::PutEndItem* item = end.add_items();
  item->set_key("abandoned");
  item->set_put_id(reserved.results(0).put_id());
  v1::BatchPutEndResponse ended;
  grpc::ClientContext end_context;
  ASSERT_TRUE(stub->BatchPutEnd(&end_context, end, &ended).ok());
  EXPECT_EQ(ended.results(0).code(), v1::OBJECT_NOT_FOUND);
  EXPECT_TRUE(client->Put("abandoned", "fresh").ok());
}

class SegmentFailureTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<MasterProcess> master = testing::StartMaster(
        {"--embedded-segment-size=0", "--segment-ttl=2s", "--heartbeat-interval=200ms"});
    ASSERT_TRUE(master.ok()) << master.status();
    master_ = std::move(*master);
    for (int i = 0; i < 2; ++i) {
      absl::StatusOr<SegmentProcess> segment =
          testing::StartSegment(master_.grpc, "256MiB", {"--name=seg-" + std::to_string(i)});
      ASSERT_TRUE(segment.ok()) << segment.status();
      segments_.push_back(std::move(*segment));
    }
    client_ = Connect(master_.grpc, /*verify=*/true);
  }

  size_t MountedSegments() { return client_->GetClusterStatus()->segments.size(); }

  MasterProcess master_;
  std::vector<SegmentProcess> segments_;
  std::unique_ptr<Client> client_;
};

TEST_F(SegmentFailureTest, KilledMidPutNoHangNoWrongBytesAndTheMasterNotices) {
  // A big batch spread over both segments; one dies while it is being written.
  std::vector<std::string> values;
  std::vector<PutItem> items;
  for (int i = 0; i < 64; ++i) values.push_back(testing::RandomValue(2 << 20, i));
  for (int i = 0; i < 64; ++i) {
    items.push_back({"k" + std::to_string(i), {{values[i].data(), values[i].size()}}});
  }
  std::vector<absl::Status> results;
  absl::Time started = absl::Now();
  std::thread writer([&] { results = client_->BatchPut(items); });
  absl::SleepFor(absl::Milliseconds(15));
  segments_[0].process->Signal(SIGKILL);
  writer.join();
  EXPECT_LT(absl::Now() - started, absl::Seconds(10)) << "the batch hung";
  for (int i = 0; i < 64; ++i) {
    if (!results[i].ok()) {
      // WRITE_FAIL: written and committed, but its segment died before recording the
      // commit: never acknowledged as OK.
      EXPECT_TRUE(ToErrorCode(results[i]) == v1::TRANSFER_FAIL ||
                  ToErrorCode(results[i]) == v1::RPC_FAIL ||
                  ToErrorCode(results[i]) == v1::WRITE_FAIL)
          << results[i];
    }
  }
  // Every key that answered OK reads back exactly (if its segment survived), never garbage.
  for (int i = 0; i < 64; ++i) {
    if (!results[i].ok()) continue;
    absl::StatusOr<std::string> back = client_->Get(items[i].key);
    if (back.ok()) {
      EXPECT_TRUE(*back == values[i]) << items[i].key;
    } else {
      EXPECT_TRUE(ToErrorCode(back.status()) == v1::TRANSFER_FAIL ||
                  ToErrorCode(back.status()) == v1::OBJECT_NOT_FOUND)
          << back.status();
    }
  }
  // The master declares it dead within the TTL; what it held is then not found.
  absl::Time killed = absl::Now();
  ASSERT_TRUE(Eventually([&] { return MountedSegments() == 1; }, absl::Seconds(5)));
  EXPECT_LT(absl::Now() - killed, absl::Seconds(3));
  for (int i = 0; i < 64; ++i) {
    if (!results[i].ok()) continue;
    absl::StatusOr<std::string> back = client_->Get(items[i].key);
    if (back.ok()) {
      EXPECT_TRUE(*back == values[i]);
    } else {
      EXPECT_EQ(ToErrorCode(back.status()), v1::OBJECT_NOT_FOUND) << back.status();
    }
  }
}

TEST_F(SegmentFailureTest, KilledMidGetNoHangAndReplicasElsewhereStayReadable) {
  std::vector<std::string> values;
  std::vector<std::string> keys;
  for (int i = 0; i < 32; ++i) {
    values.push_back(testing::RandomValue(2 << 20, 500 + i));
    keys.push_back("r" + std::to_string(i));
    ASSERT_TRUE(client_->Put(keys[i], values[i], {.replicas = i % 2 == 0 ? 2u : 1u}).ok());
  }
  std::vector<std::string> back(32, std::string(2 << 20, '\0'));
  std::vector<GetItem> gets;
  for (int i = 0; i < 32; ++i) gets.push_back({keys[i], {{back[i].data(), back[i].size()}}});
  std::vector<absl::StatusOr<uint64_t>> results;
  std::thread reader([&] { results = client_->BatchGet(gets); });
  absl::SleepFor(absl::Milliseconds(10));
  segments_[1].process->Signal(SIGKILL);
  reader.join();
  for (int i = 0; i < 32; ++i) {
    if (results[i].ok()) {
      EXPECT_TRUE(back[i] == values[i]) << keys[i] << " read wrong bytes";
    }
  }
  ASSERT_TRUE(Eventually([&] { return MountedSegments() == 1; }, absl::Seconds(5)));
  // Objects with two replicas live on; the others are gone or on the survivor.
  for (int i = 0; i < 32; i += 2) {
    absl::StatusOr<std::string> value = client_->Get(keys[i]);
    ASSERT_TRUE(value.ok()) << keys[i] << ": " << value.status();
    EXPECT_TRUE(*value == values[i]);
  }
}

TEST_F(SegmentFailureTest, RestartedSegmentMountsAgainCleanly) {
  ASSERT_TRUE(client_->Put("before", "x", {.replicas = 1}).ok());
  std::string name = segments_[0].name;
  segments_[0].process->Signal(SIGKILL);
  segments_[0].process->Wait();
  absl::StatusOr<SegmentProcess> again =
      testing::StartSegment(master_.grpc, "256MiB", {"--name=" + name});
  ASSERT_TRUE(again.ok()) << again.status();
  segments_[0] = std::move(*again);
  // The new incarnation replaced the old one at once: two segments, both active.
  absl::StatusOr<ClusterStatus> status = client_->GetClusterStatus();
  ASSERT_EQ(status->segments.size(), 2u);
  for (int i = 0; i < 20; ++i) {
    std::string key = "after-" + std::to_string(i);
    ASSERT_TRUE(client_->Put(key, testing::RandomValue(1 << 20, i)).ok());
    EXPECT_TRUE(*client_->Get(key) == testing::RandomValue(1 << 20, i));
  }
}

TEST_F(SegmentFailureTest, DrainedSegmentLeavesAndObjectsWithAnotherReplicaStay) {
  ASSERT_TRUE(client_->Put("two", testing::RandomValue(1 << 20, 1), {.replicas = 2}).ok());
  std::string drained = segments_[0].name;
  ASSERT_TRUE(client_->DrainSegment(drained, {.migrate = false}).ok());
  EXPECT_EQ(ToErrorCode(client_->DrainSegment("no-such-segment").status()),
            v1::SEGMENT_NOT_FOUND);
  // Nothing new lands there.
  for (int i = 0; i < 10; ++i) {
    ASSERT_TRUE(client_->Put("new-" + std::to_string(i), "v").ok());
  }
  absl::StatusOr<ClusterStatus> status = client_->GetClusterStatus();
  for (const SegmentStatus& segment : status->segments) {
    if (segment.name == drained) {
      EXPECT_EQ(segment.state, "draining");
      EXPECT_EQ(segment.replicas, 1u);
    }
  }
  // Nothing on it is leased: it is unmounted and the process stops by itself.
  int wait_status = segments_[0].process->Wait();
  EXPECT_TRUE(WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == 0) << wait_status;
  EXPECT_EQ(MountedSegments(), 1u);
  EXPECT_TRUE(*client_->Get("two") == testing::RandomValue(1 << 20, 1));
}

TEST_F(SegmentFailureTest, DrainCopiesEveryObjectElsewhereAndTheCopiesSurviveAMasterRestart) {
  constexpr int kObjects = 40;
  for (int i = 0; i < kObjects; ++i) {
    ASSERT_TRUE(client_->Put("d" + std::to_string(i), testing::RandomValue(1 << 20, i)).ok());
  }
  std::string drained = segments_[0].name;
  uint64_t on_drained = 0;
  absl::StatusOr<ClusterStatus> before = client_->GetClusterStatus();
  ASSERT_TRUE(before.ok()) << before.status();
  for (const SegmentStatus& segment : before->segments) {
    if (segment.name == drained) on_drained = segment.replicas;
  }
  ASSERT_GT(on_drained, 0u) << "the puts did not spread over both segments";
  absl::StatusOr<DrainReport> report =
      client_->DrainSegment(drained, {.batch_objects = 7, .batch_bytes = 4 << 20});
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->moved_objects, on_drained);
  EXPECT_EQ(report->moved_bytes, on_drained << 20);
  EXPECT_EQ(report->failed_copies, 0u);
  EXPECT_EQ(report->unplaceable, 0u);
  // Nothing of it is needed any more: it leaves and its process stops by itself.
  int wait_status = segments_[0].process->Wait();
  EXPECT_TRUE(WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == 0) << wait_status;
  EXPECT_EQ(MountedSegments(), 1u);
  std::unique_ptr<Client> fresh = Connect(master_.grpc, /*verify=*/true);
  for (int i = 0; i < kObjects; ++i) {
    absl::StatusOr<std::string> value = fresh->Get("d" + std::to_string(i));
    ASSERT_TRUE(value.ok()) << i << ": " << value.status();
    EXPECT_TRUE(*value == testing::RandomValue(1 << 20, i)) << i;
  }
  // The copies are in the remaining segment's manifest: a restarted master finds them.
  std::string address = master_.grpc;
  master_.process->Signal(SIGKILL);
  master_.process->Wait();
  absl::StatusOr<MasterProcess> master = testing::StartMaster(
      {"--embedded-segment-size=0", "--segment-ttl=2s", "--heartbeat-interval=200ms"}, address);
  ASSERT_TRUE(master.ok()) << master.status();
  master_ = std::move(*master);
  ASSERT_TRUE(segments_[1].process->WaitForLine("kvpool-segment mounted", absl::Seconds(10)).ok());
  ASSERT_TRUE(Eventually([&] { return fresh->GetClusterStatus().ok(); }, absl::Seconds(5)));
  EXPECT_EQ(fresh->GetClusterStatus()->objects, static_cast<uint64_t>(kObjects));
  for (int i = 0; i < kObjects; ++i) {
    absl::StatusOr<std::string> value = fresh->Get("d" + std::to_string(i));
    ASSERT_TRUE(value.ok()) << i << ": " << value.status();
    EXPECT_TRUE(*value == testing::RandomValue(1 << 20, i)) << i;
  }
}

TEST(MasterRestartDurabilityTest, EveryCommittedObjectIsReadableAgainAfterARestartUnderLoad) {
  absl::StatusOr<MasterProcess> master = testing::StartMaster({"--embedded-segment-size=0"});
  ASSERT_TRUE(master.ok()) << master.status();
  std::string address = master->grpc;
  std::vector<SegmentProcess> segments;
  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<SegmentProcess> segment =
        testing::StartSegment(address, "128MiB", {"--name=durable-" + std::to_string(i)});
    ASSERT_TRUE(segment.ok()) << segment.status();
    segments.push_back(std::move(*segment));
  }
  std::unique_ptr<Client> client = Connect(address);
  // Writers keep committing while the master is killed; every key whose put answered OK
  // must come back.
  std::atomic<bool> stop{false};
  std::atomic<int> commits{0};
  std::vector<std::vector<std::string>> committed(2);
  std::vector<std::thread> writers;
  for (int w = 0; w < 2; ++w) {
    writers.emplace_back([&, w] {
      for (int i = 0; !stop.load(); ++i) {
        std::string key = "w" + std::to_string(w) + "-" + std::to_string(i);
        if (client->Put(key, testing::RandomValue(64 << 10, w * 100000 + i)).ok()) {
          committed[w].push_back(key);
          commits.fetch_add(1);
        }
      }
    });
  }
  // Kill the master while both writers are busy, once the load is well under way.
  ASSERT_TRUE(Eventually([&] { return commits.load() >= 40; }, absl::Seconds(30)));
  master->process->Signal(SIGKILL);
  master->process->Wait();
  absl::SleepFor(absl::Milliseconds(200));
  stop = true;
  for (std::thread& writer : writers) writer.join();
  size_t total = committed[0].size() + committed[1].size();
  ASSERT_GT(total, 10u) << "the load did not get going";

  master = testing::StartMaster({"--embedded-segment-size=0"}, address);
  ASSERT_TRUE(master.ok()) << master.status();
  for (SegmentProcess& segment : segments) {
    ASSERT_TRUE(segment.process->WaitForLine("kvpool-segment mounted", absl::Seconds(10)).ok());
  }
  ASSERT_TRUE(Eventually([&] { return client->GetClusterStatus().ok(); }, absl::Seconds(5)))
      << client->GetClusterStatus().status();
  // Every put that answered OK is back. A put whose answer the dying master never sent may
  // be back too: it was committed and recorded, the client just did not hear so.
  uint64_t restored = client->GetClusterStatus()->objects;
  EXPECT_GE(restored, total);
  EXPECT_LE(restored, total + 2);  // at most one unanswered put per writer
  for (int w = 0; w < 2; ++w) {
    for (size_t k = 0; k < committed[w].size(); ++k) {
      const std::string& key = committed[w][k];
      int i = std::stoi(key.substr(key.find('-') + 1));
      absl::StatusOr<std::string> value = client->Get(key, {.verify_checksum = true});
      ASSERT_TRUE(value.ok()) << key << ": " << value.status();
      EXPECT_TRUE(*value == testing::RandomValue(64 << 10, w * 100000 + i)) << key;
    }
  }
  // Removed objects stay removed across a restart, and new puts do not overlap old ones.
  ASSERT_TRUE(client->Remove(committed[0][0], /*force=*/true).ok());
  for (int i = 0; i < 20; ++i) ASSERT_TRUE(client->Put("post-" + std::to_string(i), "p").ok());
  master->process->Signal(SIGKILL);
  master->process->Wait();
  master = testing::StartMaster({"--embedded-segment-size=0"}, address);
  ASSERT_TRUE(master.ok());
  for (SegmentProcess& segment : segments) {
    ASSERT_TRUE(segment.process->WaitForLine("kvpool-segment mounted", absl::Seconds(10)).ok());
  }
  ASSERT_TRUE(Eventually([&] { return client->GetClusterStatus().ok(); }, absl::Seconds(5)));
  EXPECT_FALSE(*client->Exists(committed[0][0]));
  EXPECT_EQ(client->GetClusterStatus()->objects, restored - 1 + 20);
}

// A client reuses a get's answer while its lease runs (ClientOptions::cache_locations). A
// forced remove pulls the object away under that lease: the next get must notice (the cached
// read is checked against the checksum) and answer from the master, never the stale bytes.
TEST(LocationCacheTest, ForceRemovedAndRewrittenKeyIsReadFreshNeverStale) {
  absl::StatusOr<MasterProcess> master = testing::StartMaster({"--embedded-segment-size=8MiB"});
  ASSERT_TRUE(master.ok()) << master.status();
  std::unique_ptr<Client> reader = Connect(master->grpc);
  std::unique_ptr<Client> writer = Connect(master->grpc);
  const std::string old_value = testing::RandomValue(1 << 20, 1);
  const std::string new_value = testing::RandomValue(1 << 20, 2);
  ASSERT_TRUE(writer->Put("k", old_value).ok());
  for (int i = 0; i < 3; ++i) EXPECT_EQ(reader->Get("k").value_or(""), old_value);
  EXPECT_NE(reader->MetricsText().find("kvpool_client_location_cache_hits_total 2"),
            std::string::npos)
      << reader->MetricsText();

  // Rewritten in place: the pool is empty again, so the allocator gives the same range.
  ASSERT_TRUE(writer->Remove("k", /*force=*/true).ok());
  ASSERT_TRUE(writer->Put("k", new_value).ok());
  EXPECT_EQ(reader->Get("k").value_or(""), new_value);
  std::string buffer(new_value.size(), '\0');
  MutableBuffer into{buffer.data(), buffer.size()};
  EXPECT_EQ(reader->Get("k", absl::MakeConstSpan(&into, 1)).value_or(0), new_value.size());
  EXPECT_EQ(buffer, new_value);

  // Removed, and its range given to another key: a miss, never the other key's bytes. (Were
  // the range left as it was, the intact bytes of "k" could still be answered from the cache
  // until the lease runs out: see docs/semantics.md.)
  ASSERT_TRUE(writer->Remove("k", /*force=*/true).ok());
  ASSERT_TRUE(writer->Put("other", old_value).ok());
  EXPECT_EQ(ToErrorCode(reader->Get("k").status()), v1::OBJECT_NOT_FOUND);
  EXPECT_EQ(ToErrorCode(reader->Get("k", absl::MakeConstSpan(&into, 1)).status()),
            v1::OBJECT_NOT_FOUND);
}

TEST(IntegrityTest, CorruptedByteIsChecksumMismatchNeverData) {
  absl::StatusOr<MasterProcess> master = testing::StartMaster({"--embedded-segment-size=0"});
  ASSERT_TRUE(master.ok()) << master.status();
  absl::StatusOr<SegmentProcess> segment =
      testing::StartSegment(master->grpc, "16MiB", {"--enable-test-hooks"});
  ASSERT_TRUE(segment.ok()) << segment.status();
  std::unique_ptr<Client> client = Connect(master->grpc);
  std::string value = testing::RandomValue(100000, 42);
  ASSERT_TRUE(client->Put("precious", value).ok());
  // Where it lives, from the master.
  auto stub = v1::MasterService::NewStub(MakeMasterChannel(master->grpc));
  v1::BatchGetReplicaListRequest request;
  request.add_keys("precious");
  v1::BatchGetReplicaListResponse located;
  grpc::ClientContext context;
  ASSERT_TRUE(stub->BatchGetReplicaList(&context, request, &located).ok());
  uint64_t offset = located.results(0).replicas(0).offset();
  EXPECT_NE(located.results(0).checksum(), 0u);

  absl::StatusOr<std::string> flipped = testing::HttpGet(
      segment->http, "/debug/corrupt?offset=" + std::to_string(offset + 777));
  ASSERT_TRUE(flipped.ok()) << flipped.status();

  absl::StatusOr<std::string> checked = client->Get("precious", {.verify_checksum = true});
  EXPECT_EQ(ToErrorCode(checked.status()), v1::CHECKSUM_MISMATCH) << checked.status();
  std::string buffer(value.size(), '\0');
  MutableBuffer into{buffer.data(), buffer.size()};
  absl::StatusOr<uint64_t> read =
      client->Get("precious", absl::MakeConstSpan(&into, 1), {.verify_checksum = true});
  EXPECT_EQ(read.status().code(), absl::StatusCode::kDataLoss);
  // Over TCP (the client above reads through shared memory), where the transport hashes the
  // bytes as they arrive, the same.
  ClientOptions tcp_options;
  tcp_options.master_address = master->grpc;
  tcp_options.transport = TransportKind::kTcp;
  absl::StatusOr<std::unique_ptr<Client>> tcp = Client::Create(tcp_options);
  ASSERT_TRUE(tcp.ok()) << tcp.status();
  absl::StatusOr<std::string> over_tcp = (*tcp)->Get("precious", {.verify_checksum = true});
  EXPECT_EQ(ToErrorCode(over_tcp.status()), v1::CHECKSUM_MISMATCH) << over_tcp.status();
  // kvpoolctl always checks.
  std::unique_ptr<testing::Process> ctl = *testing::Process::Start(
      testing::CtlBinary(), {"--master=" + master->grpc, "--json", "get", "precious", "/dev/null"});
  std::string line = ctl->WaitForLine("", absl::Seconds(20)).value_or("");
  EXPECT_EQ(WEXITSTATUS(ctl->Wait()), 1);
  EXPECT_NE(line.find("CHECKSUM_MISMATCH"), std::string::npos) << line;
}

}  // namespace
}  // namespace kvpool
