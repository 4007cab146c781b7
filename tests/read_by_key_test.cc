// Reads by key (READ_KEY, docs/protocol.md) against real processes: a key's first get goes
// straight to its home segment with no master call; a removed key is never served; a segment
// cut off from its master stops serving reads by key; the values are the bytes written.

#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kvpool/client.h"
#include "proto/error_codes.h"
#include "proto/frame.h"
#include "tests/harness/cluster.h"
#include "tests/harness/eventually.h"
#include "tests/harness/raw_tcp.h"
#include "tests/harness/values.h"

namespace kvpool {
namespace {

using testing::MasterProcess;
using testing::SegmentProcess;

std::unique_ptr<Client> Connect(const std::string& master, bool read_by_key = true) {
  ClientOptions options;
  options.master_address = master;
  options.rpc_timeout = absl::Seconds(3);
  options.transfer_timeout = absl::Seconds(5);
  options.transport = TransportKind::kTcp;
  options.read_by_key = read_by_key;
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Create(options);
  EXPECT_TRUE(client.ok()) << client.status();
  return client.ok() ? std::move(*client) : nullptr;
}

// The value of a counter line "name value" in a client's metrics (0 if absent).
uint64_t Counter(Client& client, const std::string& name_and_labels) {
  std::string text = "\n" + client.MetricsText();
  std::string line = "\n" + name_and_labels + " ";
  size_t at = text.find(line);
  return at == std::string::npos ? 0 : std::stoull(text.substr(at + line.size()));
}

// Gets `keys` into buffers of `capacity` bytes each, in one batch.
std::vector<absl::StatusOr<std::string>> BatchGet(Client& client,
                                                  const std::vector<std::string>& keys,
                                                  size_t capacity) {
  std::vector<std::string> buffers(keys.size(), std::string(capacity, '\0'));
  std::vector<GetItem> items;
  for (size_t i = 0; i < keys.size(); ++i) {
    items.push_back({keys[i], {MutableBuffer{buffers[i].data(), capacity}}});
  }
  std::vector<absl::StatusOr<uint64_t>> sizes = client.BatchGet(items);
  std::vector<absl::StatusOr<std::string>> values;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (sizes[i].ok()) {
      values.push_back(buffers[i].substr(0, *sizes[i]));
    } else {
      values.push_back(sizes[i].status());
    }
  }
  return values;
}

class KeyReadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<MasterProcess> master = testing::StartMaster(
        {"--embedded-segment-size=0", "--heartbeat-interval=200ms", "--segment-ttl=2s"});
    ASSERT_TRUE(master.ok()) << master.status();
    master_ = std::move(*master);
    for (int i = 0; i < 2; ++i) {
      absl::StatusOr<SegmentProcess> segment =
          testing::StartSegment(master_.grpc, "32MiB", {absl::StrCat("--name=seg-", i)});
      ASSERT_TRUE(segment.ok()) << segment.status();
      segments_.push_back(std::move(*segment));
    }
    writer_ = Connect(master_.grpc);
    ASSERT_NE(writer_, nullptr);
  }

  MasterProcess master_;
  std::vector<SegmentProcess> segments_;
  std::unique_ptr<Client> writer_;
};

TEST_F(KeyReadTest, FirstGetsReadTheirHomeSegmentWithoutTheMaster) {
  std::vector<std::string> keys;
  std::vector<std::string> values;
  for (int i = 0; i < 64; ++i) {
    keys.push_back(absl::StrCat("block-", i));
    values.push_back(testing::RandomValue(4096 + i, i));
    ASSERT_TRUE(writer_->Put(keys.back(), values.back()).ok());
  }
  std::unique_ptr<Client> reader = Connect(master_.grpc);
  ASSERT_NE(reader, nullptr);
  std::vector<absl::StatusOr<std::string>> got = BatchGet(*reader, keys, 8192);
  for (size_t i = 0; i < keys.size(); ++i) {
    ASSERT_TRUE(got[i].ok()) << keys[i] << ": " << got[i].status();
    EXPECT_EQ(*got[i], values[i]) << keys[i];
  }
  // Every key was placed on its home (both segments have room) and read there.
  EXPECT_EQ(Counter(*reader, "kvpool_client_key_reads_total{result=\"hit\"}"), 64u);
  EXPECT_EQ(Counter(*reader, "kvpool_client_master_lookups_total"), 0u);
  // The homes are spread over both segments.
  std::unique_ptr<Client> admin = Connect(master_.grpc);
  absl::StatusOr<ClusterStatus> status = admin->GetClusterStatus();
  ASSERT_TRUE(status.ok());
  for (const auto& segment : status->segments) EXPECT_GT(segment.replicas, 10u) << segment.name;

  // Single gets too, one at a time; a key absent everywhere is asked of the master.
  for (int i = 0; i < 8; ++i) {
    std::string buffer(8192, '\0');
    absl::StatusOr<uint64_t> size = reader->Get(keys[i], {MutableBuffer{buffer.data(), 8192}});
    ASSERT_TRUE(size.ok()) << size.status();
    EXPECT_EQ(buffer.substr(0, *size), values[i]);
  }
  std::vector<absl::StatusOr<std::string>> absent = BatchGet(*reader, {"never-put"}, 8192);
  EXPECT_EQ(absent[0].status().code(), absl::StatusCode::kNotFound) << absent[0].status();
  EXPECT_EQ(Counter(*reader, "kvpool_client_key_reads_total{result=\"miss\"}"), 1u);
  EXPECT_EQ(Counter(*reader, "kvpool_client_master_lookups_total"), 1u);
  // A buffer too small for the value: the master's answer says so.
  std::vector<absl::StatusOr<std::string>> small = BatchGet(*reader, {keys[0]}, 100);
  EXPECT_EQ(ToErrorCode(small[0].status()), ErrorCode::BUFFER_OVERFLOW) << small[0].status();
}

TEST_F(KeyReadTest, RemovedOrRewrittenKeysAreNeverServedStale) {
  ASSERT_TRUE(writer_->Put("gone", "first bytes").ok());
  std::unique_ptr<Client> reader = Connect(master_.grpc);
  ASSERT_EQ(*BatchGet(*reader, {"gone"}, 64)[0], "first bytes");
  ASSERT_TRUE(writer_->Remove("gone").ok());
  // Acknowledged only once the segment forgot it: no read by key finds it afterwards.
  EXPECT_EQ(BatchGet(*reader, {"gone"}, 64)[0].status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(writer_->Put("gone", "second bytes!").ok());
  EXPECT_EQ(*BatchGet(*reader, {"gone"}, 64)[0], "second bytes!");
  EXPECT_EQ(Counter(*reader, "kvpool_client_key_reads_total{result=\"hit\"}"), 2u);
}

TEST_F(KeyReadTest, ASegmentCutOffFromTheMasterStopsServingReadsByKey) {
  ASSERT_TRUE(writer_->Put("k", "value").ok());
  std::unique_ptr<Client> reader = Connect(master_.grpc);
  ASSERT_EQ(*BatchGet(*reader, {"k"}, 64)[0], "value");
  // The master stops answering: within half the segment TTL (1 s) every segment stops
  // serving reads by key (it may have missed a removal); the client then asks the master,
  // which does not answer, and the get fails instead of returning what may be stale.
  master_.process->Signal(SIGSTOP);
  absl::SleepFor(absl::Milliseconds(1500));
  std::vector<absl::StatusOr<std::string>> cut_off = BatchGet(*reader, {"k"}, 64);
  EXPECT_FALSE(cut_off[0].ok());
  EXPECT_EQ(Counter(*reader, "kvpool_client_key_reads_total{result=\"miss\"}"), 1u);
  master_.process->Signal(SIGCONT);
  EXPECT_TRUE(testing::Eventually(
      [&] {
        std::vector<absl::StatusOr<std::string>> back = BatchGet(*reader, {"k"}, 64);
        return back[0].ok() && *back[0] == "value";
      },
      absl::Seconds(10)));
}

TEST_F(KeyReadTest, ReadByKeyOffStillReadsThroughTheMaster) {
  ASSERT_TRUE(writer_->Put("k", "value").ok());
  std::unique_ptr<Client> reader = Connect(master_.grpc, /*read_by_key=*/false);
  EXPECT_EQ(*BatchGet(*reader, {"k"}, 64)[0], "value");
  EXPECT_EQ(Counter(*reader, "kvpool_client_key_reads_total{result=\"hit\"}"), 0u);
  EXPECT_EQ(Counter(*reader, "kvpool_client_master_lookups_total"), 1u);
}

// The master's LRU does not see reads by key; the segments report them with their heartbeats
// (keys_read), so a key read only that way stays hot: a full pool evicts the others first.
TEST(KeyReadLruTest, KeysReadByKeyAreKeptOverOlderUnreadOnes) {
  absl::StatusOr<MasterProcess> master =
      testing::StartMaster({"--embedded-segment-size=0", "--heartbeat-interval=200ms"});
  ASSERT_TRUE(master.ok()) << master.status();
  std::vector<SegmentProcess> segments;
  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<SegmentProcess> segment = testing::StartSegment(master->grpc, "2MiB");
    ASSERT_TRUE(segment.ok()) << segment.status();
    segments.push_back(std::move(*segment));
  }
  std::unique_ptr<Client> writer = Connect(master->grpc);
  ASSERT_NE(writer, nullptr);
  constexpr size_t kValue = 64 << 10;  // 64 fill both pools
  auto key = [](int i) { return absl::StrCat("lru-", i); };
  for (int i = 0; i < 56; ++i)
    ASSERT_TRUE(writer->Put(key(i), testing::RandomValue(kValue, i)).ok());
  // The oldest 16, read by key only (no master call, no lease).
  std::unique_ptr<Client> reader = Connect(master->grpc);
  std::vector<std::string> hot;
  for (int i = 0; i < 16; ++i) hot.push_back(key(i));
  std::vector<absl::StatusOr<std::string>> got = BatchGet(*reader, hot, kValue);
  for (int i = 0; i < 16; ++i) {
    ASSERT_TRUE(got[i].ok()) << got[i].status();
    EXPECT_EQ(*got[i], testing::RandomValue(kValue, i));
  }
  ASSERT_EQ(Counter(*reader, "kvpool_client_key_reads_total{result=\"hit\"}"), 16u);
  ASSERT_EQ(Counter(*reader, "kvpool_client_master_lookups_total"), 0u);
  absl::SleepFor(absl::Milliseconds(1500));  // a few heartbeats
  // 24 more values than fit: the least recently used make room.
  for (int i = 56; i < 80; ++i)
    ASSERT_TRUE(writer->Put(key(i), testing::RandomValue(kValue, i)).ok());
  std::vector<std::string> all;
  for (int i = 0; i < 80; ++i) all.push_back(key(i));
  std::vector<absl::StatusOr<bool>> exists = writer->BatchExist(all);
  int unread_gone = 0;
  for (int i = 0; i < 80; ++i) {
    ASSERT_TRUE(exists[i].ok()) << exists[i].status();
    if (i < 16) EXPECT_TRUE(*exists[i]) << key(i) << " was read, yet evicted";
    if (i >= 16 && i < 56 && !*exists[i]) ++unread_gone;
    if (i >= 56) EXPECT_TRUE(*exists[i]) << key(i);
  }
  EXPECT_GE(unread_gone, 16);
}

}  // namespace
}  // namespace kvpool
