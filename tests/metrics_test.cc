// /metrics, /healthz and /readyz of real processes after a known workload: every counter
// moves by exactly what the workload did, pressure and eviction included.

#include <map>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kvpool/client.h"
#include "proto/error_codes.h"
#include "tests/harness/cluster.h"
#include "tests/harness/http_get.h"

namespace kvpool {
namespace {

// "name{labels}" -> value, from the Prometheus text format.
std::map<std::string, double> Scrape(const std::string& address) {
  absl::StatusOr<std::string> text = testing::HttpGet(address, "/metrics");
  EXPECT_TRUE(text.ok()) << text.status();
  std::map<std::string, double> samples;
  std::istringstream lines(text.value_or(""));
  std::string line;
  while (std::getline(lines, line)) {
    if (line.empty() || line[0] == '#') continue;
    size_t space = line.rfind(' ');
    samples[line.substr(0, space)] = std::stod(line.substr(space + 1));
  }
  return samples;
}

double Sample(const std::map<std::string, double>& samples, const std::string& name) {
  auto it = samples.find(name);
  EXPECT_NE(it, samples.end()) << "no sample " << name;
  return it == samples.end() ? -1 : it->second;
}

TEST(MetricsTest, CountersMoveByExactlyWhatAKnownWorkloadDid) {
  absl::StatusOr<testing::MasterProcess> master =
      testing::StartMaster({"--embedded-segment-size=0", "--lease-ttl=1s"});
  ASSERT_TRUE(master.ok()) << master.status();
  absl::StatusOr<testing::SegmentProcess> segment = testing::StartSegment(master->grpc, "4MiB");
  ASSERT_TRUE(segment.ok()) << segment.status();
  for (const std::string& address : {master->http, segment->http}) {
    EXPECT_EQ(testing::HttpGet(address, "/healthz").value_or(""), "ok\n");
    EXPECT_TRUE(testing::HttpGet(address, "/readyz").ok()) << address;
  }
  ClientOptions options;
  options.master_address = master->grpc;
  options.transport = TransportKind::kTcp;  // the segment's TCP counters are under test
  std::unique_ptr<Client> client = std::move(Client::Create(options).value());

  const std::string small(64 << 10, 's');
  const std::string big(2 << 20, 'b');
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(client->Put("k" + std::to_string(i), small).ok());
  EXPECT_EQ(ToErrorCode(client->Put("k0", small)), v1::OBJECT_ALREADY_EXISTS);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(client->Get("k" + std::to_string(i)).ok());
  EXPECT_EQ(ToErrorCode(client->Get("missing-1").status()), v1::OBJECT_NOT_FOUND);
  EXPECT_EQ(ToErrorCode(client->Get("missing-2").status()), v1::OBJECT_NOT_FOUND);
  std::vector<std::string> probe = {"k3", "k4", "nope-1", "nope-2"};
  client->BatchExist(probe);
  // Every small object is leased now: of two 2 MiB values only one fits.
  std::vector<PutItem> pair = {{"big-1", {{big.data(), big.size()}}},
                               {"big-2", {{big.data(), big.size()}}}};
  std::vector<absl::Status> pressure = client->BatchPut(pair);
  EXPECT_TRUE(pressure[0].ok()) << pressure[0];
  EXPECT_EQ(ToErrorCode(pressure[1]), v1::NO_AVAILABLE_HANDLE) << pressure[1];
  // Once the leases run out, 2 MiB more evicts the five small objects and big-1 (in that
  // order: least recently used first) to make room.
  absl::SleepFor(absl::Milliseconds(1200));
  ASSERT_TRUE(client->Put("after", big).ok());

  std::map<std::string, double> m = Scrape(master->http);
  auto key = [](const char* method, const char* code) {
    return std::string("kvpool_key_results_total{method=\"") + method + "\",code=\"" + code + "\"}";
  };
  EXPECT_EQ(Sample(m, key("BatchPutStart", "OK")), 7);
  EXPECT_EQ(Sample(m, key("BatchPutStart", "OBJECT_ALREADY_EXISTS")), 1);
  EXPECT_EQ(Sample(m, key("BatchPutStart", "NO_AVAILABLE_HANDLE")), 1);
  EXPECT_EQ(Sample(m, key("BatchPutEnd", "OK")), 7);
  EXPECT_EQ(Sample(m, key("BatchGetReplicaList", "OK")), 3);
  EXPECT_EQ(Sample(m, key("BatchGetReplicaList", "OBJECT_NOT_FOUND")), 2);
  EXPECT_EQ(Sample(m, key("BatchExist", "OK")), 2);
  EXPECT_EQ(Sample(m, key("BatchExist", "OBJECT_NOT_FOUND")), 2);
  EXPECT_EQ(Sample(m, "kvpool_rpc_requests_total{method=\"BatchPutStart\"}"), 8);
  EXPECT_EQ(Sample(m, "kvpool_rpc_requests_total{method=\"BatchGetReplicaList\"}"), 5);
  EXPECT_EQ(Sample(m, "kvpool_rpc_failures_total{method=\"BatchPutStart\"}"), 0);
  EXPECT_EQ(Sample(m, "kvpool_rpc_duration_seconds_count{method=\"BatchExist\"}"), 1);
  EXPECT_EQ(Sample(m, "kvpool_evictions_total"), 6);
  EXPECT_EQ(Sample(m, "kvpool_evicted_bytes_total"), 5 * (64 << 10) + (2 << 20));
  EXPECT_EQ(Sample(m, "kvpool_objects"), 1);
  EXPECT_EQ(Sample(m, "kvpool_objects_pending"), 0);
  EXPECT_EQ(Sample(m, "kvpool_segments_mounted"), 1);
  EXPECT_EQ(Sample(m, "kvpool_segment_capacity_bytes{segment=\"" + segment->name + "\"}"),
            4 << 20);
  EXPECT_EQ(Sample(m, "kvpool_segment_used_bytes{segment=\"" + segment->name + "\"}"), 2 << 20);
  EXPECT_EQ(Sample(m, "kvpool_pins_active{kind=\"hard\"}"), 0);

  std::map<std::string, double> s = Scrape(segment->http);
  EXPECT_EQ(Sample(s, "kvpool_segment_pool_bytes"), 4 << 20);
  EXPECT_EQ(Sample(s, "kvpool_segment_mounted"), 1);
  EXPECT_EQ(Sample(s, "kvpool_data_requests_total{op=\"write\",transport=\"tcp\"}"), 7);
  EXPECT_EQ(Sample(s, "kvpool_data_requests_total{op=\"read\",transport=\"tcp\"}"), 3);
  EXPECT_EQ(Sample(s, "kvpool_data_bytes_total{op=\"write\",transport=\"tcp\"}"),
            5 * (64 << 10) + 2 * (2 << 20));
  EXPECT_EQ(Sample(s, "kvpool_data_bytes_total{op=\"read\",transport=\"tcp\"}"), 3 * (64 << 10));
  EXPECT_EQ(
      Sample(s, "kvpool_data_request_duration_seconds_count{op=\"write\",transport=\"tcp\"}"), 7);
  EXPECT_EQ(Sample(s, "kvpool_data_rejected_total{reason=\"token\"}"), 0);

  std::string client_text = client->MetricsText();
  EXPECT_NE(client_text.find("kvpool_client_bytes_total{op=\"put\"} " +
                             std::to_string(5 * (64 << 10) + 2 * (2 << 20))),
            std::string::npos)
      << client_text;
  EXPECT_NE(client_text.find("kvpool_client_get_duration_seconds_count 5"), std::string::npos);

  absl::StatusOr<ClusterStatus> status = client->GetClusterStatus();
  EXPECT_EQ(status->get_hits, 3u);
  EXPECT_EQ(status->get_misses, 2u);
  EXPECT_EQ(status->put_deduplicated, 1u);
  EXPECT_EQ(status->put_no_space, 1u);
}

// A commit costs its segment one heartbeat round trip: the batch's records go out in one
// answer to the segment's poll, and the heartbeat that acknowledges them parks the next poll
// (it used to cost three: the first record, the rest, and an empty answer to the
// acknowledgement).
TEST(MetricsTest, ACommitCostsItsSegmentOneHeartbeat) {
  absl::StatusOr<testing::MasterProcess> master = testing::StartMaster(
      {"--embedded-segment-size=0", "--heartbeat-interval=5s", "--segment-ttl=30s"});
  ASSERT_TRUE(master.ok()) << master.status();
  absl::StatusOr<testing::SegmentProcess> segment = testing::StartSegment(master->grpc, "4MiB");
  ASSERT_TRUE(segment.ok()) << segment.status();
  ClientOptions options;
  options.master_address = master->grpc;
  std::unique_ptr<Client> client = std::move(Client::Create(options).value());
  const std::string value(1024, 'v');
  const std::string heartbeats = "kvpool_rpc_requests_total{method=\"Heartbeat\"}";
  constexpr int kBatches = 10;
  double before = Sample(Scrape(master->http), heartbeats);
  for (int batch = 0; batch < kBatches; ++batch) {
    std::vector<PutItem> items;
    for (int i = 0; i < 8; ++i) {
      items.push_back({absl::StrCat("b", batch, "-", i), {{value.data(), value.size()}}});
    }
    for (const absl::Status& put : client->BatchPut(items)) ASSERT_TRUE(put.ok()) << put;
  }
  double after = Sample(Scrape(master->http), heartbeats);
  // One per commit, and at most one more that a poll's 5 s hold ran out in the meantime.
  EXPECT_GE(after - before, kBatches);
  EXPECT_LE(after - before, kBatches + 1);
}

TEST(MetricsTest, SegmentIsNotReadyUntilMounted) {
  // A segment pointed at a master that is not there: alive, not ready.
  std::unique_ptr<testing::Process> process = *testing::Process::Start(
      testing::SegmentBinary(), {"--master=127.0.0.1:1", "--size=1MiB", "--listen=127.0.0.1:0",
                                 "--http-listen=127.0.0.1:0", "--prefault=false"});
  std::string line = process->WaitForLine("kvpool-segment listening", absl::Seconds(20)).value();
  std::string http = testing::Field(line, "http");
  EXPECT_EQ(testing::HttpGet(http, "/healthz").value_or(""), "ok\n");
  absl::StatusOr<testing::HttpReply> ready = testing::HttpFetch(http, "/readyz");
  ASSERT_TRUE(ready.ok());
  EXPECT_EQ(ready->status, 503);
  std::map<std::string, double> s = Scrape(http);
  EXPECT_EQ(Sample(s, "kvpool_segment_mounted"), 0);
}

}  // namespace
}  // namespace kvpool
