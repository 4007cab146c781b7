// Each transport that runs here (TCP, shared memory) against real processes: bytes, choice of
// transport, refusal, restarts and clients that die mid-transfer.

#include <signal.h>
#include <sys/wait.h>

#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <thread>

#include "gtest/gtest.h"
#include "kvpool/client.h"
#include "proto/checksum.h"
#include "proto/error_codes.h"
#include "server/segment/memory_pool.h"
#include "tests/harness/cluster.h"
#include "tests/harness/values.h"
#include "tests/harness/http_get.h"

namespace kvpool {
namespace {

using testing::MasterProcess;
using testing::SegmentProcess;

std::unique_ptr<Client> Connect(const std::string& master, TransportKind transport) {
  ClientOptions options;
  options.master_address = master;
  options.transport = transport;
  options.transfer_timeout = absl::Seconds(10);
  return std::move(Client::Create(options).value());
}

double Metric(const std::string& text, const std::string& name) {
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind(name + " ", 0) == 0) return std::stod(line.substr(name.size() + 1));
  }
  return -1;
}

double SegmentTcpRequests(const SegmentProcess& segment) {
  std::string text = testing::HttpGet(segment.http, "/metrics").value_or("");
  return Metric(text, "kvpool_data_requests_total{op=\"write\",transport=\"tcp\"}") +
         Metric(text, "kvpool_data_requests_total{op=\"read\",transport=\"tcp\"}");
}

// Round trips of many sizes, gathered from and scattered into several buffers.
void RoundTrips(Client& client, const std::string& prefix) {
  for (size_t size : {size_t{1}, size_t{4096}, size_t{65537}, size_t{1} << 20, size_t{16} << 20}) {
    std::string value = testing::RandomValue(size, static_cast<uint32_t>(size));
    std::string key = prefix + std::to_string(size);
    size_t half = size / 2;
    std::vector<ConstBuffer> parts = {{value.data(), half}, {value.data() + half, size - half}};
    absl::Status put = client.Put(key, parts);
    ASSERT_TRUE(put.ok()) << key << ": " << put;
    std::string back(size, '\0');
    size_t third = size / 3;
    std::vector<MutableBuffer> into = {{back.data(), third}, {back.data() + third, size - third}};
    absl::StatusOr<uint64_t> read = client.Get(key, into);
    ASSERT_TRUE(read.ok()) << key << ": " << read.status();
    EXPECT_TRUE(back == value) << key;
  }
}

TEST(SharedMemoryTest, SameMachineClientsCopyThroughSharedMemory) {
  absl::StatusOr<MasterProcess> master = testing::StartMaster({"--embedded-segment-size=0"});
  ASSERT_TRUE(master.ok()) << master.status();
  absl::StatusOr<SegmentProcess> segment = testing::StartSegment(master->grpc, "64MiB");
  ASSERT_TRUE(segment.ok()) << segment.status();
  std::unique_ptr<Client> client = Connect(master->grpc, TransportKind::kAuto);
  RoundTrips(*client, "shm-");
  EXPECT_EQ(SegmentTcpRequests(*segment), 0) << "bytes went over TCP";
  std::string metrics = client->MetricsText();
  EXPECT_EQ(Metric(metrics, "kvpool_client_transfers_total{transport=\"shm\"}"), 10);
  EXPECT_EQ(Metric(metrics, "kvpool_client_transfers_total{transport=\"tcp\"}"), 0);
  // A TCP-only client reads what the shared-memory one wrote, and the other way round.
  std::unique_ptr<Client> tcp = Connect(master->grpc, TransportKind::kTcp);
  EXPECT_TRUE(*tcp->Get("shm-65537") == testing::RandomValue(65537, 65537));
  ASSERT_TRUE(tcp->Put("over-tcp", testing::RandomValue(100000, 7)).ok());
  EXPECT_TRUE(*client->Get("over-tcp") == testing::RandomValue(100000, 7));
  EXPECT_EQ(SegmentTcpRequests(*segment), 2);
}

// A batch of more than 8 MiB is copied by several threads (RoutingTransport::CopyAll), each
// a run of the batch's keys: every key's bytes land where they belong, both ways.
TEST(SharedMemoryTest, LargeBatchesAreCopiedByteForByteOnSeveralThreads) {
  absl::StatusOr<MasterProcess> master = testing::StartMaster({"--embedded-segment-size=0"});
  ASSERT_TRUE(master.ok()) << master.status();
  absl::StatusOr<SegmentProcess> segment = testing::StartSegment(master->grpc, "128MiB");
  ASSERT_TRUE(segment.ok()) << segment.status();
  std::unique_ptr<Client> client = Connect(master->grpc, TransportKind::kSharedMemory);
  // Sizes of every scale, so that the threads' runs hold different numbers of keys.
  std::vector<std::string> values;
  std::vector<PutItem> items;
  for (int i = 0; i < 40; ++i) {
    size_t size = i % 4 == 0 ? (size_t{3} << 20) + i : size_t{4096} * (i + 1) + 7;
    values.push_back(testing::RandomValue(size, 1000 + i));
  }
  for (int i = 0; i < 40; ++i) {
    const std::string& v = values[i];
    items.push_back(
        {.key = "big-batch-" + std::to_string(i),
         .parts = {{v.data(), v.size() / 3}, {v.data() + v.size() / 3, v.size() - v.size() / 3}}});
  }
  for (const absl::Status& s : client->BatchPut(items)) ASSERT_TRUE(s.ok()) << s;
  std::vector<std::string> back;
  std::vector<GetItem> gets;
  for (int i = 0; i < 40; ++i) back.emplace_back(values[i].size(), '\0');
  for (int i = 0; i < 40; ++i) {
    gets.push_back({.key = items[i].key, .parts = {{back[i].data(), back[i].size()}}});
  }
  std::vector<absl::StatusOr<uint64_t>> read = client->BatchGet(gets);
  for (int i = 0; i < 40; ++i) {
    ASSERT_TRUE(read[i].ok()) << items[i].key << ": " << read[i].status();
    EXPECT_EQ(*read[i], values[i].size());
    EXPECT_TRUE(back[i] == values[i]) << items[i].key;
  }
  EXPECT_EQ(SegmentTcpRequests(*segment), 0) << "bytes went over TCP";
}

TEST(SharedMemoryTest, RefusedClientFallsBackToTcp) {
  absl::StatusOr<MasterProcess> master = testing::StartMaster({"--embedded-segment-size=0"});
  ASSERT_TRUE(master.ok()) << master.status();
  // Only uid 4242 may map this pool: not us.
  absl::StatusOr<SegmentProcess> segment =
      testing::StartSegment(master->grpc, "64MiB", {"--shm-uids=4242"});
  ASSERT_TRUE(segment.ok()) << segment.status();
  std::unique_ptr<Client> client = Connect(master->grpc, TransportKind::kSharedMemory);
  RoundTrips(*client, "refused-");
  EXPECT_EQ(SegmentTcpRequests(*segment), 10);
  std::string metrics = client->MetricsText();
  EXPECT_EQ(Metric(metrics, "kvpool_client_transfers_total{transport=\"shm\"}"), 0);
}

TEST(SharedMemoryTest, BatchesSpanShmAndTcpSegmentsAtOnce) {
  absl::StatusOr<MasterProcess> master = testing::StartMaster({"--embedded-segment-size=0"});
  ASSERT_TRUE(master.ok()) << master.status();
  absl::StatusOr<SegmentProcess> shm = testing::StartSegment(master->grpc, "64MiB");
  absl::StatusOr<SegmentProcess> tcp_only =
      testing::StartSegment(master->grpc, "64MiB", {"--shm-socket=none"});
  ASSERT_TRUE(shm.ok() && tcp_only.ok());
  std::unique_ptr<Client> client = Connect(master->grpc, TransportKind::kAuto);
  std::vector<std::string> values;
  std::vector<PutItem> puts;
  for (int i = 0; i < 32; ++i) values.push_back(testing::RandomValue(512 << 10, 100 + i));
  for (int i = 0; i < 32; ++i) {
    puts.push_back({"mixed-" + std::to_string(i), {{values[i].data(), values[i].size()}}});
  }
  for (const absl::Status& status : client->BatchPut(puts)) ASSERT_TRUE(status.ok()) << status;
  std::vector<std::string> back(32, std::string(512 << 10, '\0'));
  std::vector<GetItem> gets;
  for (int i = 0; i < 32; ++i) gets.push_back({puts[i].key, {{back[i].data(), back[i].size()}}});
  for (const absl::StatusOr<uint64_t>& read : client->BatchGet(gets)) ASSERT_TRUE(read.ok());
  for (int i = 0; i < 32; ++i) EXPECT_TRUE(back[i] == values[i]) << i;
  EXPECT_EQ(SegmentTcpRequests(*shm), 0);
  EXPECT_GT(SegmentTcpRequests(*tcp_only), 0);
}

TEST(SharedMemoryTest, ZeroCopyReserveCommitAndGetLocal) {
  absl::StatusOr<MasterProcess> master = testing::StartMaster({"--embedded-segment-size=0"});
  ASSERT_TRUE(master.ok()) << master.status();
  absl::StatusOr<SegmentProcess> segment = testing::StartSegment(master->grpc, "64MiB");
  ASSERT_TRUE(segment.ok()) << segment.status();
  std::unique_ptr<Client> client = Connect(master->grpc, TransportKind::kAuto);
  client->MapLocalPools();
  std::vector<MappedPool> pools = client->MappedPools();
  ASSERT_EQ(pools.size(), 1u);
  EXPECT_EQ(pools[0].size, 64u << 20);

  std::vector<std::string> keys = {"zc-0", "zc-1"};
  std::vector<uint64_t> sizes = {1 << 20, 12345};
  std::vector<absl::StatusOr<LocalReservation>> reserved = client->BatchReserveLocal(keys, sizes);
  std::vector<LocalReservation> filled;
  for (size_t i = 0; i < keys.size(); ++i) {
    ASSERT_TRUE(reserved[i].ok()) << reserved[i].status();
    EXPECT_GE(reserved[i]->data, pools[0].base);
    EXPECT_LE(reserved[i]->data + sizes[i], pools[0].base + pools[0].size);
    std::string value = testing::RandomValue(sizes[i], 900 + i);
    std::memcpy(reserved[i]->data, value.data(), value.size());  // what a GPU copy would do
    filled.push_back(*reserved[i]);
  }
  EXPECT_FALSE(*client->Exists("zc-0")) << "visible before commit";
  for (const absl::Status& status : client->BatchCommitLocal(filled)) EXPECT_TRUE(status.ok());
  // Anyone reads them, checksums included; and a local reader gets pointers into the pool.
  std::unique_ptr<Client> tcp = Connect(master->grpc, TransportKind::kTcp);
  EXPECT_TRUE(*tcp->Get("zc-0", {.verify_checksum = true}) == testing::RandomValue(1 << 20, 900));
  absl::Time lease;
  std::vector<absl::StatusOr<LocalValue>> local = client->BatchGetLocal(keys, &lease);
  for (size_t i = 0; i < keys.size(); ++i) {
    ASSERT_TRUE(local[i].ok()) << local[i].status();
    ASSERT_EQ(local[i]->size, sizes[i]);
    EXPECT_EQ(std::memcmp(local[i]->data, testing::RandomValue(sizes[i], 900 + i).data(), sizes[i]), 0);
  }
  EXPECT_GT(lease, absl::Now());
  EXPECT_EQ(ToErrorCode(client->BatchReserveLocal({"zc-0"}, {std::vector<uint64_t>{10}})[0].status()),
            v1::OBJECT_ALREADY_EXISTS);
  // Abandoned reservations vanish.
  std::vector<absl::StatusOr<LocalReservation>> dropped =
      client->BatchReserveLocal({"zc-dropped"}, {std::vector<uint64_t>{100}});
  ASSERT_TRUE(dropped[0].ok());
  client->BatchAbandonLocal({*dropped[0]});
  EXPECT_EQ(client->GetClusterStatus()->pending_objects, 0u);
  EXPECT_EQ(SegmentTcpRequests(*segment), 1);  // only the TCP client's read
}

// A writer that hashed the bytes where they came from (a GPU) gives the checksum with the
// reservation: it is recorded as given, local readers see it, and a wrong one is never taken
// for the truth (the commit is refused, or readers report the mismatch).
TEST(SharedMemoryTest, ZeroCopyCommitTakesTheWritersChecksum) {
  absl::StatusOr<MasterProcess> master = testing::StartMaster({"--embedded-segment-size=0"});
  ASSERT_TRUE(master.ok()) << master.status();
  absl::StatusOr<SegmentProcess> segment = testing::StartSegment(master->grpc, "64MiB");
  ASSERT_TRUE(segment.ok()) << segment.status();
  std::unique_ptr<Client> client = Connect(master->grpc, TransportKind::kAuto);
  client->MapLocalPools();
  const std::vector<std::string> keys = {"given-right", "given-wrong", "hashed-here"};
  const std::vector<uint64_t> sizes = {1 << 20, 4096, 777};
  std::vector<absl::StatusOr<LocalReservation>> reserved = client->BatchReserveLocal(keys, sizes);
  std::vector<LocalReservation> filled;
  std::vector<uint64_t> sums;
  for (size_t i = 0; i < keys.size(); ++i) {
    ASSERT_TRUE(reserved[i].ok()) << reserved[i].status();
    std::string value = testing::RandomValue(sizes[i], 300 + i);
    std::memcpy(reserved[i]->data, value.data(), value.size());
    sums.push_back(wire::Checksum({iovec{value.data(), value.size()}}));
    filled.push_back(*reserved[i]);
  }
  filled[0].checksum = sums[0];
  filled[1].checksum = sums[1] ^ 1;
  std::vector<absl::Status> committed = client->BatchCommitLocal(filled);
  EXPECT_TRUE(committed[0].ok()) << committed[0];
  EXPECT_TRUE(committed[2].ok()) << committed[2];
  absl::Time lease;
  std::vector<absl::StatusOr<LocalValue>> local = client->BatchGetLocal(keys, &lease);
  ASSERT_TRUE(local[0].ok() && local[2].ok());
  EXPECT_EQ(local[0]->checksum, sums[0]);
  EXPECT_EQ(local[2]->checksum, sums[2]);
  std::unique_ptr<Client> tcp = Connect(master->grpc, TransportKind::kTcp);
  EXPECT_TRUE(*tcp->Get("given-right", {.verify_checksum = true}) ==
              testing::RandomValue(1 << 20, 300));
  if (committed[1].ok()) {
    EXPECT_EQ(tcp->Get("given-wrong", {.verify_checksum = true}).status().code(),
              absl::StatusCode::kDataLoss);
  } else {
    EXPECT_EQ(ToErrorCode(committed[1]), v1::CHECKSUM_MISMATCH) << committed[1];
    EXPECT_FALSE(*tcp->Exists("given-wrong"));
  }
}

TEST(SharedMemoryTest, ZeroCopyNeedsASegmentOnThisMachineThatAdmitsUs) {
  absl::StatusOr<MasterProcess> master = testing::StartMaster({"--embedded-segment-size=0"});
  ASSERT_TRUE(master.ok()) << master.status();
  absl::StatusOr<SegmentProcess> segment =
      testing::StartSegment(master->grpc, "64MiB", {"--shm-uids=4242"});
  ASSERT_TRUE(segment.ok()) << segment.status();
  std::unique_ptr<Client> client = Connect(master->grpc, TransportKind::kAuto);
  std::vector<absl::StatusOr<LocalReservation>> reserved =
      client->BatchReserveLocal({"refused"}, {std::vector<uint64_t>{100}});
  EXPECT_EQ(reserved[0].status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(client->GetClusterStatus()->pending_objects, 0u) << "the reservation was kept";
  ASSERT_TRUE(client->Put("plain", "value").ok());
  absl::Time lease;
  EXPECT_EQ(client->BatchGetLocal({"plain"}, &lease)[0].status().code(),
            absl::StatusCode::kFailedPrecondition);
}

class RestartTest : public ::testing::TestWithParam<TransportKind> {};

TEST_P(RestartTest, SegmentRestartedMidBatchNeverYieldsWrongBytes) {
  absl::StatusOr<MasterProcess> master = testing::StartMaster({"--embedded-segment-size=0"});
  ASSERT_TRUE(master.ok()) << master.status();
  absl::StatusOr<SegmentProcess> segment =
      testing::StartSegment(master->grpc, "256MiB", {"--name=restarting"});
  ASSERT_TRUE(segment.ok()) << segment.status();
  std::string data = segment->data;
  std::unique_ptr<Client> client = Connect(master->grpc, GetParam());
  std::vector<std::string> values;
  std::vector<PutItem> puts;
  for (int i = 0; i < 64; ++i) values.push_back(testing::RandomValue(1 << 20, 500 + i));
  for (int i = 0; i < 64; ++i) {
    puts.push_back({"r-" + std::to_string(i), {{values[i].data(), values[i].size()}}});
  }
  ASSERT_TRUE(client->BatchPut(puts)[0].ok());
  std::vector<std::string> back(64, std::string(1 << 20, '\0'));
  std::vector<GetItem> gets;
  for (int i = 0; i < 64; ++i) gets.push_back({puts[i].key, {{back[i].data(), back[i].size()}}});
  std::vector<absl::StatusOr<uint64_t>> reads;
  std::thread reader([&] {
    for (int round = 0; round < 5; ++round) reads = client->BatchGet(gets);
  });
  absl::SleepFor(absl::Milliseconds(20));
  segment->process->Signal(SIGKILL);
  segment->process->Wait();
  // Same name, same endpoint, a new process with an empty pool.
  segment = testing::StartSegment(master->grpc, "256MiB",
                                  {"--name=restarting", "--listen=" + data});
  ASSERT_TRUE(segment.ok()) << segment.status();
  reader.join();
  for (int i = 0; i < 64; ++i) {
    if (reads[i].ok()) {
      EXPECT_TRUE(back[i] == values[i]) << "wrong bytes for " << puts[i].key;
    }
  }
  // The restart dropped the old objects; new ones land in the new pool and read back exactly,
  // also for a shared-memory client that had mapped the old pool.
  EXPECT_FALSE(*client->Exists("r-0"));
  for (int i = 0; i < 8; ++i) {
    ASSERT_TRUE(client->Put("new-" + std::to_string(i), values[i]).ok());
    EXPECT_TRUE(*client->Get("new-" + std::to_string(i)) == values[i]);
  }
}

INSTANTIATE_TEST_SUITE_P(Transports, RestartTest,
                         ::testing::Values(TransportKind::kTcp, TransportKind::kSharedMemory));

class ClientKilledTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ClientKilledTest, ClientKilledMidPutLeavesNothingVisibleAndTheServersServing) {
  absl::StatusOr<MasterProcess> master =
      testing::StartMaster({"--embedded-segment-size=0", "--put-timeout=2s"});
  ASSERT_TRUE(master.ok()) << master.status();
  absl::StatusOr<SegmentProcess> segment = testing::StartSegment(master->grpc, "512MiB");
  ASSERT_TRUE(segment.ok()) << segment.status();
  std::string file = ::testing::TempDir() + "/kvpool_big_value.bin";
  {
    std::string big = testing::RandomValue(384 << 20, 3);
    std::ofstream(file, std::ios::binary).write(big.data(), static_cast<std::streamsize>(big.size()));
  }
  // kvpoolctl reads the 384 MiB file and starts writing it; it dies in the middle.
  std::unique_ptr<testing::Process> ctl = *testing::Process::Start(
      testing::CtlBinary(),
      {"--master=" + master->grpc, "--transport=" + GetParam(), "put", "dying", file});
  absl::SleepFor(absl::Milliseconds(900));
  ctl->Signal(SIGKILL);
  ctl->Wait();
  std::unique_ptr<Client> client = Connect(master->grpc, TransportKind::kAuto);
  absl::StatusOr<bool> exists = client->Exists("dying");
  ASSERT_TRUE(exists.ok());
  if (*exists) {
    // It finished before the kill: then it must be whole.
    absl::StatusOr<std::string> value = client->Get("dying", {.verify_checksum = true});
    ASSERT_TRUE(value.ok()) << value.status();
  } else {
    // Its reservation, if it got one, is reclaimed.
    absl::Time deadline = absl::Now() + absl::Seconds(5);
    while (client->GetClusterStatus()->pending_objects > 0 && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(100));
    }
    EXPECT_EQ(client->GetClusterStatus()->pending_objects, 0u);
    EXPECT_EQ(client->GetClusterStatus()->used_bytes, 0u);
  }
  RoundTrips(*client, "after-");
}

INSTANTIATE_TEST_SUITE_P(Transports, ClientKilledTest, ::testing::Values("tcp", "shm"));

using segment::FreeHugePages;

TEST(HugePagesTest, SegmentOnHugePagesServesTcpAndSharedMemory) {
  constexpr int64_t kPages = 16;  // a 32 MiB pool: RoundTrips needs about 17 MiB
  int64_t before = FreeHugePages();
  if (before < kPages) {
    GTEST_SKIP() << "needs " << kPages << " free huge pages, this machine has " << before
                 << " (sysctl vm.nr_hugepages=" << kPages << " runs this test)";
  }
  absl::StatusOr<MasterProcess> master = testing::StartMaster({"--embedded-segment-size=0"});
  ASSERT_TRUE(master.ok()) << master.status();
  absl::StatusOr<SegmentProcess> segment =
      testing::StartSegment(master->grpc, "32MiB", {"--hugepages"});
  ASSERT_TRUE(segment.ok()) << segment.status();
  EXPECT_EQ(FreeHugePages(), before - kPages) << "the pool did not come from huge pages";
  std::unique_ptr<Client> shm = Connect(master->grpc, TransportKind::kAuto);
  RoundTrips(*shm, "huge-shm-");
  EXPECT_EQ(SegmentTcpRequests(*segment), 0) << "bytes went over TCP";
  std::unique_ptr<Client> tcp = Connect(master->grpc, TransportKind::kTcp);
  EXPECT_TRUE(*tcp->Get("huge-shm-65537") == testing::RandomValue(65537, 65537));
  ASSERT_TRUE(tcp->Put("huge-tcp", testing::RandomValue(300000, 9)).ok());
  EXPECT_TRUE(*shm->Get("huge-tcp") == testing::RandomValue(300000, 9));
}

TEST(HugePagesTest, SegmentWithoutEnoughHugePagesSaysSoAndExits) {
  int64_t free_pages = FreeHugePages();
  if (free_pages < 0) GTEST_SKIP() << "this kernel reports no HugePages_Free";
  std::string size = std::to_string((free_pages + 1) * 2) + "MiB";
  std::string command = testing::SegmentBinary() + " --hugepages --size=" + size +
                        " --master=127.0.0.1:1 --listen=127.0.0.1:0 --http-listen=127.0.0.1:0"
                        " --shm-socket=none 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string output;
  char chunk[512];
  while (size_t n = fread(chunk, 1, sizeof chunk, pipe)) output.append(chunk, n);
  int status = pclose(pipe);
  ASSERT_TRUE(WIFEXITED(status)) << output;
  EXPECT_EQ(WEXITSTATUS(status), 2) << output;
  EXPECT_NE(output.find("huge pages"), std::string::npos) << output;
  EXPECT_NE(output.find(std::to_string(free_pages) + " free"), std::string::npos) << output;
  EXPECT_EQ(output.find("listening"), std::string::npos) << output;
}

}  // namespace
}  // namespace kvpool
