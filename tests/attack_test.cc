// Attacks on the promise "no wrong bytes, ever", against real kvpool-master and
// kvpool-segment processes, written as an attacker would write them: raw data-plane frames
// with kept, replayed and late tokens, a writer paused past its deadline, a control path cut
// by a proxy, exhausted descriptors, a pool truncated through its memfd, silent admission
// peers, two servers on one address. Each asserts that no reader gets wrong bytes, that no
// acknowledged commit is lost, and that the servers keep serving others.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/net.h"
#include "gtest/gtest.h"
#include "kvpool/client.h"
#include "kvpool/v1/master.grpc.pb.h"
#include "proto/channel.h"
#include "proto/checksum.h"
#include "proto/error_codes.h"
#include "proto/frame.h"
#include "proto/shm_handshake.h"
#include "tests/harness/cluster.h"
#include "tests/harness/eventually.h"
#include "tests/harness/raw_tcp.h"
#include "tests/harness/http_get.h"
#include "tests/harness/values.h"

namespace kvpool {
namespace {

using testing::Eventually;
using testing::MasterProcess;
using testing::SegmentProcess;

void SendAll(int fd, const void* data, size_t size) {
  const char* at = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t n = send(fd, at, size, MSG_NOSIGNAL);
    if (n <= 0) return;  // the segment closed on us: what is left is not delivered
    at += n;
    size -= static_cast<size_t>(n);
  }
}

wire::RequestHeader HeaderFor(wire::Opcode opcode, const v1::Placement& placement) {
  wire::RequestHeader header{.opcode = opcode,
                             .request_id = 7,
                             .offset = placement.offset(),
                             .length = placement.length()};
  std::memcpy(header.token.data(), placement.token().data(),
              std::min(header.token.size(), placement.token().size()));
  return header;
}

void SendHeader(int fd, const wire::RequestHeader& header) {
  uint8_t bytes[wire::kRequestHeaderSize];
  wire::EncodeRequest(header, bytes);
  SendAll(fd, bytes, sizeof(bytes));
}

// The segment's answer to one request: its status, and the data or the reason.
std::pair<int32_t, std::string> ReadAnswer(int fd) {
  uint8_t response[wire::kResponseHeaderSize];
  if (recv(fd, response, sizeof(response), MSG_WAITALL) != static_cast<ssize_t>(sizeof(response))) {
    return {v1::TRANSFER_FAIL, "no answer"};
  }
  absl::StatusOr<wire::ResponseHeader> header = wire::DecodeResponse(response);
  if (!header.ok()) return {v1::TRANSFER_FAIL, std::string(header.status().message())};
  wire::ResponseHeader decoded = *header;
  std::string body(std::min<uint64_t>(decoded.length, 64 << 20), '\0');
  if (!body.empty()) recv(fd, body.data(), body.size(), MSG_WAITALL);
  return {decoded.status, body};
}

// A raw WRITE of `bytes` at `placement`, with the placement's token.
std::pair<int32_t, std::string> RawWrite(const std::string& endpoint,
                                         const v1::Placement& placement,
                                         const std::string& bytes) {
  int fd = testing::ConnectRawTcp(endpoint);
  SendHeader(fd, HeaderFor(wire::Opcode::kWrite, placement));
  SendAll(fd, bytes.data(), bytes.size());
  auto answer = ReadAnswer(fd);
  close(fd);
  return answer;
}

std::pair<int32_t, std::string> RawRead(const std::string& endpoint,
                                        const v1::Placement& placement) {
  int fd = testing::ConnectRawTcp(endpoint);
  SendHeader(fd, HeaderFor(wire::Opcode::kRead, placement));
  auto answer = ReadAnswer(fd);
  close(fd);
  return answer;
}

// A pool of one segment process (so manifests and the master link are real), with a raw
// gRPC stub for the attacker and a default client for the honest readers and writers.
class AttackTest : public ::testing::Test {
 protected:
  void StartCluster(std::vector<std::string> master_args = {},
                    std::vector<std::string> segment_args = {},
                    const std::string& pool_size = "16MiB") {
    master_args.push_back("--embedded-segment-size=0");
    absl::StatusOr<MasterProcess> master = testing::StartMaster(master_args);
    ASSERT_TRUE(master.ok()) << master.status();
    master_ = std::move(*master);
    absl::StatusOr<SegmentProcess> segment =
        testing::StartSegment(master_.grpc, pool_size, segment_args);
    ASSERT_TRUE(segment.ok()) << segment.status();
    segment_ = std::move(*segment);
    Connect();
    ASSERT_TRUE(client_->Put("canary", "still here").ok());
  }

  void Connect() {
    ClientOptions options;
    options.master_address = master_.grpc;
    options.transport = TransportKind::kTcp;
    options.cache_locations = false;
    client_ = std::move(Client::Create(options).value());
    stub_ = v1::MasterService::NewStub(MakeMasterChannel(master_.grpc));
  }

  void RestartMaster(std::vector<std::string> master_args = {}) {
    std::string address = master_.grpc;
    master_.process->Signal(SIGKILL);
    master_.process->Wait();
    master_args.push_back("--embedded-segment-size=0");
    absl::StatusOr<MasterProcess> master = testing::StartMaster(master_args, address);
    ASSERT_TRUE(master.ok()) << master.status();
    master_ = std::move(*master);
    ASSERT_TRUE(segment_.process->WaitForLine("kvpool-segment mounted", absl::Seconds(20)).ok());
    ASSERT_TRUE(Eventually([&] { return client_->GetClusterStatus().ok(); }, absl::Seconds(10)));
  }

  void TearDown() override {
    if (client_ == nullptr) return;
    // Whatever the attacker did, the pool still serves reads and writes.
    EXPECT_EQ(client_->Get("canary").value_or("<lost>"), "still here");
    absl::Status after = client_->Put("after", "ok");
    EXPECT_TRUE(after.ok()) << after;
    EXPECT_EQ(client_->Get("after").value_or("<lost>"), "ok");
  }

  v1::PutStartResult Reserve(const std::string& key, uint64_t size) {
    v1::BatchPutStartRequest request;
    request.add_keys(key);
    request.add_sizes(size);
    v1::BatchPutStartResponse response;
    grpc::ClientContext context;
    EXPECT_TRUE(stub_->BatchPutStart(&context, request, &response).ok());
    EXPECT_EQ(response.results(0).code(), v1::OK) << response.results(0).message();
    return response.results(0);
  }

  int32_t Commit(const std::string& key, uint64_t put_id, uint64_t checksum) {
    v1::BatchPutEndRequest request;
    v1::PutEndItem* item = request.add_items();
    item->set_key(key);
    item->set_put_id(put_id);
    item->set_checksum(checksum);
    v1::BatchPutEndResponse response;
    grpc::ClientContext context;
    if (!stub_->BatchPutEnd(&context, request, &response).ok()) return v1::RPC_FAIL;
    return response.results(0).code();
  }

  int32_t Revoke(const std::string& key, uint64_t put_id) {
    v1::BatchPutRevokeRequest request;
    v1::PutEndItem* item = request.add_items();
    item->set_key(key);
    item->set_put_id(put_id);
    v1::BatchPutRevokeResponse response;
    grpc::ClientContext context;
    if (!stub_->BatchPutRevoke(&context, request, &response).ok()) return v1::RPC_FAIL;
    return response.results(0).code();
  }

  v1::GetResult Locate(const std::string& key) {
    v1::BatchGetReplicaListRequest request;
    request.add_keys(key);
    v1::BatchGetReplicaListResponse response;
    grpc::ClientContext context;
    EXPECT_TRUE(stub_->BatchGetReplicaList(&context, request, &response).ok());
    return response.results(0);
  }

  // Bytes allocated on the master: back to `baseline` once freed ranges were given back
  // (which waits for the segment to apply the grant's end).
  uint64_t Used() { return client_->GetClusterStatus().value().used_bytes; }

  // Bytes the master keeps out of its allocator because the segment reports them busy.
  uint64_t MasterBusy() {
    v1::GetClusterStatusRequest request;
    v1::GetClusterStatusResponse response;
    grpc::ClientContext context;
    if (!stub_->GetClusterStatus(&context, request, &response).ok()) return ~uint64_t{0};
    uint64_t busy = 0;
    for (const v1::SegmentStatus& segment : response.segments()) busy += segment.busy_bytes();
    return busy;
  }

  // Puts `count` fresh keys of kSize through the default client: each is acknowledged, reads
  // back, and lies outside [offset, offset + length). Returns the offsets they got.
  std::vector<uint64_t> PutOutside(const std::string& prefix, int count, uint64_t offset,
                                   uint64_t length, int seed);

  uint64_t Metric(const std::string& name_and_labels) {
    return MetricOf(segment_.http, name_and_labels);
  }
  uint64_t MasterMetric(const std::string& name_and_labels) {
    return MetricOf(master_.http, name_and_labels);
  }
  static uint64_t MetricOf(const std::string& http, const std::string& name_and_labels) {
    absl::StatusOr<std::string> text = testing::HttpGet(http, "/metrics");
    if (!text.ok()) return 0;
    // A sample line, not the HELP or TYPE line that names the family.
    std::string line = "\n" + name_and_labels + " ";
    size_t at = text->find(line);
    if (at == std::string::npos) return 0;
    return static_cast<uint64_t>(std::stod(text->substr(at + line.size())));
  }

  MasterProcess master_;
  SegmentProcess segment_;
  std::unique_ptr<Client> client_;
  std::unique_ptr<v1::MasterService::Stub> stub_;
};

constexpr uint64_t kSize = 256 << 10;

std::vector<uint64_t> AttackTest::PutOutside(const std::string& prefix, int count,
                                             uint64_t offset, uint64_t length, int seed) {
  std::vector<uint64_t> offsets;
  for (int i = 0; i < count; ++i) {
    std::string key = absl::StrCat(prefix, i);
    const std::string value = testing::RandomValue(kSize, seed + i);
    absl::Status put = client_->Put(key, value);
    EXPECT_TRUE(put.ok()) << key << ": " << put;
    v1::GetResult where = Locate(key);
    if (where.replicas_size() == 0) {
      ADD_FAILURE() << key << " has no replica";
      continue;
    }
    uint64_t at = where.replicas(0).offset();
    EXPECT_TRUE(at + kSize <= offset || offset + length <= at)
        << key << " placed at " << at << ", inside the busy range [" << offset << ", +"
        << length << ")";
    EXPECT_TRUE(client_->Get(key).value_or("") == value) << key;
    offsets.push_back(at);
  }
  return offsets;
}

// A write token kept after its reservation was revoked: the range now holds someone else's
// committed object.
TEST_F(AttackTest, KeptWriteTokenAfterRevokeCannotOverwriteTheNextObject) {
  StartCluster();
  uint64_t baseline = Used();
  v1::PutStartResult mine = Reserve("attacker", kSize);
  ASSERT_EQ(Revoke("attacker", mine.put_id()), v1::OK);
  ASSERT_TRUE(Eventually([&] { return Used() == baseline; }, absl::Seconds(5)));

  const std::string value = testing::RandomValue(kSize, 1);
  ASSERT_TRUE(client_->Put("victim", value).ok());
  ASSERT_EQ(Locate("victim").replicas(0).offset(), mine.placements(0).offset())
      << "the victim should reuse the attacker's range, or this test proves nothing";

  auto [status, reason] = RawWrite(segment_.data, mine.placements(0), std::string(kSize, 'X'));
  EXPECT_EQ(status, v1::PERMISSION_DENIED) << reason;
  EXPECT_NE(reason.find("grant"), std::string::npos) << reason;
  EXPECT_TRUE(client_->Get("victim").value_or("") == value);
  EXPECT_GE(Metric("kvpool_data_rejected_total{reason=\"grant_ended\"}"), 1u);
}

// A writer that writes again after its own commit: refused, and the object stays in the
// segment's manifest (it survives a master restart).
TEST_F(AttackTest, WriteAfterOwnCommitIsRefusedAndTheObjectSurvivesARestart) {
  StartCluster();
  const std::string value = testing::RandomValue(kSize, 2);
  v1::PutStartResult mine = Reserve("mine", kSize);
  ASSERT_EQ(RawWrite(segment_.data, mine.placements(0), value).first, v1::OK);
  iovec iov{const_cast<char*>(value.data()), value.size()};
  ASSERT_EQ(Commit("mine", mine.put_id(), wire::Checksum({&iov, 1})), v1::OK);

  auto [status, reason] = RawWrite(segment_.data, mine.placements(0), std::string(kSize, 'Y'));
  EXPECT_EQ(status, v1::PERMISSION_DENIED) << reason;
  EXPECT_TRUE(client_->Get("mine").value_or("") == value);

  RestartMaster();
  EXPECT_TRUE(client_->Get("mine").value_or("<lost>") == value);
}

// A write token kept past commit, remove and reuse of its range.
TEST_F(AttackTest, WriteAfterCommitRemoveAndReuseIsRefused) {
  StartCluster();
  uint64_t baseline = Used();
  v1::PutStartResult mine = Reserve("short-lived", kSize);
  ASSERT_EQ(RawWrite(segment_.data, mine.placements(0), std::string(kSize, 'a')).first, v1::OK);
  ASSERT_EQ(Commit("short-lived", mine.put_id(), 0), v1::OK);
  ASSERT_TRUE(client_->Remove("short-lived", /*force=*/true).ok());
  ASSERT_TRUE(Eventually([&] { return Used() == baseline; }, absl::Seconds(5)));
  const std::string value = testing::RandomValue(kSize, 3);
  ASSERT_TRUE(client_->Put("victim", value).ok());
  ASSERT_EQ(Locate("victim").replicas(0).offset(), mine.placements(0).offset());

  EXPECT_EQ(RawWrite(segment_.data, mine.placements(0), std::string(kSize, 'Z')).first,
            v1::PERMISSION_DENIED);
  EXPECT_TRUE(client_->Get("victim").value_or("") == value);
}

// A read token kept after a forced remove: the range now holds the next object.
TEST_F(AttackTest, ReadTokenKeptAfterForcedRemoveCannotReadTheNextObject) {
  StartCluster();
  uint64_t baseline = Used();
  ASSERT_TRUE(client_->Put("old", testing::RandomValue(kSize, 4)).ok());
  v1::GetResult old = Locate("old");
  ASSERT_EQ(old.code(), v1::OK);
  ASSERT_TRUE(client_->Remove("old", /*force=*/true).ok());
  ASSERT_TRUE(Eventually([&] { return Used() == baseline; }, absl::Seconds(5)));
  const std::string secret = testing::RandomValue(kSize, 5);
  ASSERT_TRUE(client_->Put("secret", secret).ok());
  ASSERT_EQ(Locate("secret").replicas(0).offset(), old.replicas(0).offset());

  auto [status, bytes] = RawRead(segment_.data, old.replicas(0));
  EXPECT_EQ(status, v1::PERMISSION_DENIED);
  EXPECT_TRUE(bytes != secret) << "a freed range's read token read the next object";
}

// A read already being sent when its object is force-removed, its range reused and
// rewritten: the reader (who stopped reading, so the segment's send is stuck mid-range) gets
// a prefix of the removed object's own bytes and then the end of the stream, never a byte of
// the next object, checksums or not: the segment cuts the send when it applies the removal.
TEST_F(AttackTest, ReadInFlightDuringAForcedRemoveNeverSendsTheNextObject) {
  StartCluster({}, {}, "32MiB");
  constexpr uint64_t kBig = 12 << 20;
  uint64_t baseline = Used();
  const std::string old_value = testing::RandomValue(kBig, 21);
  ASSERT_TRUE(client_->Put("old", old_value).ok());
  v1::GetResult old = Locate("old");
  ASSERT_EQ(old.code(), v1::OK);

  // A reader with a tiny receive buffer asks for the whole object and reads only a little.
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  int small = 4096;
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
  timeval timeout{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  absl::StatusOr<HostPort> data = ParseHostPort(segment_.data);
  ASSERT_TRUE(data.ok());
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(data->port);
  inet_pton(AF_INET, data->host.c_str(), &sa.sin_addr);
  ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)), 0);
  SendHeader(fd, HeaderFor(wire::Opcode::kRead, old.replicas(0)));
  std::string got(wire::kResponseHeaderSize + 64 * 1024, '\0');
  ASSERT_EQ(recv(fd, got.data(), got.size(), MSG_WAITALL), static_cast<ssize_t>(got.size()));
  ASSERT_TRUE(Eventually(
      [&] { return Metric("kvpool_data_requests_total{op=\"read\",transport=\"tcp\"}") >= 1; },
      absl::Seconds(5)));

  // Forced remove (the reader's lease does not hold it), range freed and rewritten.
  ASSERT_TRUE(client_->Remove("old", /*force=*/true).ok());
  ASSERT_TRUE(Eventually([&] { return Used() == baseline; }, absl::Seconds(5)));
  const std::string next = testing::RandomValue(kBig, 22);
  ASSERT_TRUE(client_->Put("next", next).ok());
  ASSERT_EQ(Locate("next").replicas(0).offset(), old.replicas(0).offset())
      << "the next object should reuse the range, or this test proves nothing";

  // The reader drains what it is sent: the old object's bytes up to where the send was cut.
  char buffer[64 << 10];
  while (true) {
    ssize_t n = recv(fd, buffer, sizeof(buffer), 0);
    if (n <= 0) break;
    got.append(buffer, static_cast<size_t>(n));
  }
  close(fd);
  std::string body = got.substr(wire::kResponseHeaderSize);
  EXPECT_LT(body.size(), kBig) << "the send should have been cut, not completed";
  EXPECT_TRUE(body == old_value.substr(0, body.size()))
      << "bytes other than the removed object's own reached the reader";
  EXPECT_GE(Metric("kvpool_data_reads_cut_total"), 1u);
  EXPECT_EQ(client_->Get("next").value_or("<lost>"), next);
}

// A write token from before a master restart: the new master does not know the
// reservation and hands the range to someone else.
TEST_F(AttackTest, WriteTokenFromBeforeAMasterRestartIsRefused) {
  StartCluster();
  v1::PutStartResult stale = Reserve("stale", kSize);
  RestartMaster();
  Connect();
  const std::string value = testing::RandomValue(kSize, 6);
  ASSERT_TRUE(client_->Put("victim", value).ok());
  ASSERT_EQ(Locate("victim").replicas(0).offset(), stale.placements(0).offset());

  auto [status, reason] = RawWrite(segment_.data, stale.placements(0), std::string(kSize, 'S'));
  EXPECT_EQ(status, v1::PERMISSION_DENIED) << reason;
  EXPECT_TRUE(client_->Get("victim").value_or("") == value);
}

// A writer whose header arrives in time and which is then paused (SIGSTOP) past its
// reservation's deadline; the range is reclaimed and reused; the writer resumes.
TEST_F(AttackTest, WriterPausedPastItsDeadlineLandsNothingInTheReusedRange) {
  StartCluster({"--put-timeout=2s"});
  uint64_t baseline = Used();
  v1::PutStartResult mine = Reserve("paused", kSize);
  int fd = testing::ConnectRawTcp(segment_.data);
  SendHeader(fd, HeaderFor(wire::Opcode::kWrite, mine.placements(0)));
  const std::string junk(kSize, 'P');
  SendAll(fd, junk.data(), kSize / 2);
  pid_t child = fork();
  if (child == 0) {
    raise(SIGSTOP);  // paused by the scheduler, a debugger, a GC: here, by itself
    SendAll(fd, junk.data() + kSize / 2, kSize - kSize / 2);
    _exit(0);  // the parent reads the answer
  }
  ASSERT_GT(child, 0);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, WUNTRACED), child);
  ASSERT_TRUE(WIFSTOPPED(status));

  // The reservation expires, is reclaimed, and its range is given back only once the segment
  // has ended the grant.
  ASSERT_TRUE(Eventually([&] { return Used() == baseline; }, absl::Seconds(10)));
  const std::string value = testing::RandomValue(kSize, 7);
  ASSERT_TRUE(client_->Put("victim", value).ok());
  ASSERT_EQ(Locate("victim").replicas(0).offset(), mine.placements(0).offset());

  kill(child, SIGCONT);
  ASSERT_EQ(waitpid(child, &status, 0), child);
  auto [code, reason] = ReadAnswer(fd);
  close(fd);
  EXPECT_EQ(code, v1::PERMISSION_DENIED) << reason;
  EXPECT_TRUE(client_->Get("victim").value_or("") == value);
}

// A commit with nothing (or only part, or the wrong bytes) written: the segment refuses it
// (its range does not hold the bytes of the checksum declared), the commit answers
// CHECKSUM_MISMATCH, nothing becomes visible and the range is freed; a reader never gets the
// range's old bytes as the new object.
TEST_F(AttackTest, CommitOfARangeNeverFullyWrittenIsRefused) {
  StartCluster();
  uint64_t baseline = Used();
  const std::string old_value = testing::RandomValue(kSize, 8);
  ASSERT_TRUE(client_->Put("old", old_value).ok());
  ASSERT_TRUE(client_->Remove("old", /*force=*/true).ok());
  ASSERT_TRUE(Eventually([&] { return Used() == baseline; }, absl::Seconds(5)));
  const std::string claimed = testing::RandomValue(kSize, 9);
  iovec iov{const_cast<char*>(claimed.data()), claimed.size()};
  const uint64_t checksum = wire::Checksum({&iov, 1});

  // Nothing written.
  v1::PutStartResult lazy = Reserve("lazy", kSize);
  EXPECT_EQ(Commit("lazy", lazy.put_id(), checksum), v1::CHECKSUM_MISMATCH);
  EXPECT_EQ(ToErrorCode(client_->Get("lazy").status()), v1::OBJECT_NOT_FOUND);
  // Half written, the rest of the range holds older bytes.
  // (the writer sends the header of the whole range, half the payload, and hangs up).
  v1::PutStartResult half = Reserve("half", kSize);
  int fd = testing::ConnectRawTcp(segment_.data);
  SendHeader(fd, HeaderFor(wire::Opcode::kWrite, half.placements(0)));
  SendAll(fd, claimed.data(), kSize / 2);
  absl::SleepFor(absl::Milliseconds(200));
  close(fd);
  EXPECT_EQ(Commit("half", half.put_id(), checksum), v1::CHECKSUM_MISMATCH);
  EXPECT_EQ(ToErrorCode(client_->Get("half").status()), v1::OBJECT_NOT_FOUND);
  // Wrong bytes written in full.
  v1::PutStartResult wrong = Reserve("wrong", kSize);
  auto [code, message] =
      RawWrite(segment_.data, wrong.placements(0), testing::RandomValue(kSize, 10));
  ASSERT_EQ(code, v1::OK) << message;
  EXPECT_EQ(Commit("wrong", wrong.put_id(), checksum), v1::CHECKSUM_MISMATCH);
  EXPECT_EQ(ToErrorCode(client_->Get("wrong").status()), v1::OBJECT_NOT_FOUND);
  // The refused ranges are freed (once the segment applied the FORGETs).
  EXPECT_TRUE(Eventually([&] { return Used() == baseline; }, absl::Seconds(5)))
      << Used() << " bytes used, " << baseline << " before";
  // The same bytes written in full commit.
  v1::PutStartResult honest = Reserve("honest", kSize);
  std::tie(code, message) = RawWrite(segment_.data, honest.placements(0), claimed);
  ASSERT_EQ(code, v1::OK) << message;
  EXPECT_EQ(Commit("honest", honest.put_id(), checksum), v1::OK);
  EXPECT_EQ(client_->Get("honest").value_or("<lost>"), claimed);

  // Whole TCP writes were checked by comparing the checksum they were hashed to as they
  // landed ("wrong", "honest", and the canary and "old" puts); the ranges never or half
  // written were hashed at commit ("lazy", "half").
  EXPECT_GE(Metric("kvpool_segment_commit_checks_total{how=\"compared\"}"), 4u);
  EXPECT_EQ(Metric("kvpool_segment_commit_checks_total{how=\"hashed\"}"), 2u);
  EXPECT_EQ(Metric("kvpool_segment_commits_refused_total"), 3u);
  // The master counts the refused commits under the code they were answered, not as OK.
  EXPECT_EQ(MasterMetric("kvpool_commits_refused_total"), 3u);
  EXPECT_EQ(
      MasterMetric("kvpool_key_results_total{method=\"BatchPutEnd\",code=\"CHECKSUM_MISMATCH\"}"),
      3u);
  EXPECT_EQ(MasterMetric("kvpool_key_results_total{method=\"BatchPutEnd\",code=\"OK\"}"), 3u)
      << "canary, old and honest";
}

// The control path between segment and master, cut for longer than the manifest sync
// timeout (nothing crashes): a commit is never acknowledged as OK while it is not durable.
class ControlProxy {
 public:
  explicit ControlProxy(std::string target) : target_(std::move(target)) {
    listen_fd_ = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bind(listen_fd_, reinterpret_cast<sockaddr*>(&sa), sizeof(sa));
    listen(listen_fd_, 64);
    socklen_t length = sizeof(sa);
    getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&sa), &length);
    address_ = absl::StrCat("127.0.0.1:", ntohs(sa.sin_port));
    acceptor_ = std::thread([this] { AcceptLoop(); });
  }
  ~ControlProxy() {
    stop_ = true;
    shutdown(listen_fd_, SHUT_RDWR);
    acceptor_.join();
    Cut();
    close(listen_fd_);
    for (std::thread& pump : pumps_) pump.join();
  }
  const std::string& address() const { return address_; }

  // Drops every connection and, until Heal, holds new ones open without forwarding a byte
  // (a partition: connects succeed, nothing answers).
  void Cut() {
    std::lock_guard<std::mutex> lock(mu_);
    cut_ = true;
    for (int fd : fds_) shutdown(fd, SHUT_RDWR);
  }
  void Heal() {
    std::lock_guard<std::mutex> lock(mu_);
    cut_ = false;
    for (int fd : held_) shutdown(fd, SHUT_RDWR);
  }

 private:
  void AcceptLoop() {
    while (!stop_) {
      int client = accept(listen_fd_, nullptr, nullptr);
      if (client < 0) return;
      std::lock_guard<std::mutex> lock(mu_);
      if (cut_) {
        held_.push_back(client);
        continue;
      }
      int server = testing::ConnectRawTcp(target_);
      if (server < 0) {
        close(client);
        continue;
      }
      fds_.push_back(client);
      fds_.push_back(server);
      pumps_.emplace_back([client, server] { Pump(client, server); });
      pumps_.emplace_back([client, server] { Pump(server, client); });
    }
  }
  static void Pump(int from, int to) {
    char buffer[64 << 10];
    while (true) {
      ssize_t n = recv(from, buffer, sizeof(buffer), 0);
      // SO_RCVTIMEO of ConnectRawTcp on an idle connection; 0 is the end of the stream, whatever
      // errno an earlier timeout left.
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) continue;
      if (n <= 0 || send(to, buffer, static_cast<size_t>(n), MSG_NOSIGNAL) != n) break;
    }
    shutdown(from, SHUT_RDWR);
    shutdown(to, SHUT_RDWR);
  }

  const std::string target_;
  std::string address_;
  int listen_fd_ = -1;
  std::atomic<bool> stop_{false};
  std::thread acceptor_;
  std::mutex mu_;
  bool cut_ = false;
  std::vector<int> fds_, held_;
  std::vector<std::thread> pumps_;
};

// A master (no embedded segment) and a 16 MiB segment that reaches it only through `proxy_`,
// which the test cuts and heals; the client talks to both directly.
class ControlPathTest : public AttackTest {
 protected:
  void StartPoolBehindProxy() {
    absl::StatusOr<MasterProcess> master = testing::StartMaster(master_args_);
    ASSERT_TRUE(master.ok()) << master.status();
    master_ = std::move(*master);
    proxy_ = std::make_unique<ControlProxy>(master_.grpc);
    absl::StatusOr<SegmentProcess> segment = testing::StartSegment(proxy_->address(), "16MiB");
    ASSERT_TRUE(segment.ok()) << segment.status();
    segment_ = std::move(*segment);
    Connect();
    ASSERT_TRUE(client_->Put("canary", "still here").ok());
  }

  // Puts a new key until a put is acknowledged (once the healed control path carries the
  // segment's heartbeats again) and returns that key. Each attempt takes a fresh key: an
  // attempt that answered WRITE_FAIL left its object committed (not yet known durable), so
  // putting the same key again would answer OBJECT_ALREADY_EXISTS for good.
  std::string PutUntilAcknowledged(const std::string& prefix, const std::string& value) {
    std::string acknowledged;
    absl::Status put = absl::UnknownError("not tried");
    int attempt = 0;
    EXPECT_TRUE(Eventually(
        [&] {
          std::string key = absl::StrCat(prefix, "-", attempt++);
          if (!(put = client_->Put(key, value)).ok()) return false;
          acknowledged = key;
          return true;
        },
        absl::Seconds(20)))
        << put;
    return acknowledged;
  }

  const std::vector<std::string> master_args_ = {"--embedded-segment-size=0",
                                                 "--segment-ttl=60s"};
  std::unique_ptr<ControlProxy> proxy_;
};

TEST_F(ControlPathTest, CommitIsNeverAcknowledgedWhileTheControlPathIsCut) {
  ASSERT_NO_FATAL_FAILURE(StartPoolBehindProxy());

  proxy_->Cut();
  absl::Time started = absl::Now();
  absl::Status cut_put = client_->Put("during-cut", testing::RandomValue(kSize, 10));
  // Three attempts, each waiting out the master's manifest sync timeout (2 s).
  EXPECT_GE(absl::Now() - started, absl::Seconds(5));
  EXPECT_EQ(ToErrorCode(cut_put), v1::WRITE_FAIL) << cut_put;
  EXPECT_NE(cut_put.message().find("not yet durable"), absl::string_view::npos) << cut_put;

  proxy_->Heal();
  // Once healed, commits are acknowledged again, and those are durable: they survive a
  // master restart (the segment reports them from its manifest).
  const std::string after_heal = PutUntilAcknowledged("after-heal", "durable");
  ASSERT_FALSE(after_heal.empty());
  std::string address = master_.grpc;
  master_.process->Signal(SIGKILL);
  master_.process->Wait();
  absl::StatusOr<MasterProcess> master = testing::StartMaster(master_args_, address);
  ASSERT_TRUE(master.ok()) << master.status();
  master_ = std::move(*master);
  ASSERT_TRUE(segment_.process->WaitForLine("kvpool-segment mounted", absl::Seconds(20)).ok());
  ASSERT_TRUE(Eventually([&] { return client_->Exists(after_heal).value_or(false); },
                         absl::Seconds(10)));
  EXPECT_EQ(client_->Get(after_heal).value_or("<lost>"), "durable");
  // The servers still serve others after the cut.
  EXPECT_EQ(client_->Get("canary").value_or("<lost>"), "still here");
  EXPECT_TRUE(client_->Put("after", "ok").ok());
  client_ = nullptr;
}

// The same cut, for a removal: it is never acknowledged as OK before the segment dropped the
// object from its manifest, and an acknowledged removal survives a master restart (the
// object does not come back from the segment's manifest).
TEST_F(ControlPathTest, RemoveIsNeverAcknowledgedWhileTheControlPathIsCut) {
  ASSERT_NO_FATAL_FAILURE(StartPoolBehindProxy());
  ASSERT_TRUE(client_->Put("removed-in-cut", "must stay removed").ok());
  ASSERT_TRUE(client_->Put("removed-before-restart", "must stay removed too").ok());

  proxy_->Cut();
  absl::Status cut_remove = client_->Remove("removed-in-cut");
  EXPECT_EQ(ToErrorCode(cut_remove), v1::WRITE_FAIL) << cut_remove;
  EXPECT_NE(cut_remove.message().find("not yet durable"), absl::string_view::npos) << cut_remove;
  // A retry while still cut says the same (removed from the index, not yet durable), not
  // OBJECT_NOT_FOUND; and no reader gets the object meanwhile.
  absl::Status retried = client_->Remove("removed-in-cut");
  EXPECT_EQ(ToErrorCode(retried), v1::WRITE_FAIL) << retried;
  EXPECT_NE(retried.message().find("not yet durable"), absl::string_view::npos) << retried;
  EXPECT_EQ(ToErrorCode(client_->Get("removed-in-cut").status()), v1::OBJECT_NOT_FOUND);
  proxy_->Heal();

  // Acknowledged removals are durable: the master is killed right after the OK.
  const std::string after_heal = PutUntilAcknowledged("after-heal", "durable");
  ASSERT_FALSE(after_heal.empty());
  absl::Status removed = client_->Remove("removed-before-restart");
  ASSERT_TRUE(removed.ok()) << removed;
  // The removal in the cut is applied once the segment reconnects: a retry now succeeds
  // (removal is idempotent), and the object stays removed across the restart below.
  absl::Status healed = client_->Remove("removed-in-cut");
  EXPECT_TRUE(healed.ok()) << healed;
  std::string address = master_.grpc;
  master_.process->Signal(SIGKILL);
  master_.process->Wait();
  absl::StatusOr<MasterProcess> master = testing::StartMaster(master_args_, address);
  ASSERT_TRUE(master.ok()) << master.status();
  master_ = std::move(*master);
  ASSERT_TRUE(segment_.process->WaitForLine("kvpool-segment mounted", absl::Seconds(20)).ok());
  // The segment reported its manifest: what was committed is back, what was removed is not.
  ASSERT_TRUE(Eventually([&] { return client_->Exists(after_heal).value_or(false); },
                         absl::Seconds(10)));
  EXPECT_EQ(client_->Get(after_heal).value_or("<lost>"), "durable");
  EXPECT_EQ(ToErrorCode(client_->Get("removed-before-restart").status()), v1::OBJECT_NOT_FOUND);
  EXPECT_EQ(ToErrorCode(client_->Get("removed-in-cut").status()), v1::OBJECT_NOT_FOUND);
  EXPECT_EQ(client_->Get("canary").value_or("<lost>"), "still here");
  EXPECT_TRUE(client_->Put("after", "ok").ok());
  client_ = nullptr;
}

// The segment's descriptors exhausted (prlimit): accept fails with EMFILE; the segment backs
// off (no tight loop of log lines) and serves again once descriptors are free.
TEST_F(AttackTest, ExhaustedDescriptorsDoNotSpinAndServingResumes) {
  StartCluster();
  pid_t pid = segment_.process->pid();
  rlimit old_limit{};
  ASSERT_EQ(prlimit(pid, RLIMIT_NOFILE, nullptr, &old_limit), 0);
  // Find how many descriptors the segment uses, and leave it none to spare.
  int open_now = 0;
  for (int fd = 0; fd < 4096; ++fd) {
    open_now += access(absl::StrCat("/proc/", pid, "/fd/", fd).c_str(), F_OK) == 0;
  }
  rlimit tight{static_cast<rlim_t>(open_now + 4), old_limit.rlim_max};
  ASSERT_EQ(prlimit(pid, RLIMIT_NOFILE, &tight, nullptr), 0);
  std::vector<int> hogs;
  for (int i = 0; i < 64; ++i) {
    int fd = testing::ConnectRawTcp(segment_.data);
    if (fd >= 0) hogs.push_back(fd);
  }
  absl::SleepFor(absl::Seconds(1));
  for (int fd : hogs) close(fd);
  ASSERT_EQ(prlimit(pid, RLIMIT_NOFILE, &old_limit, nullptr), 0);
  // (Read now: the HTTP server needs a descriptor too.)
  uint64_t errors = Metric("kvpool_data_accept_errors_total");
  EXPECT_GT(errors, 0u) << "the segment never ran out of descriptors";
  EXPECT_LT(errors, 200u) << "accept errors in a tight loop";
  ASSERT_TRUE(Eventually([&] { return client_->Put("served-again", "yes").ok(); },
                         absl::Seconds(10)));
  EXPECT_EQ(client_->Get("served-again").value_or(""), "yes");
}

// Idle, half-sent and 1-byte-per-second connections are closed; a connection cap holds.
TEST_F(AttackTest, IdleSlowAndExcessConnectionsAreCutOff) {
  StartCluster({}, {"--idle-timeout=1s", "--request-timeout=1s", "--max-connections=8"});
  int idle = testing::ConnectRawTcp(segment_.data);
  int slow = testing::ConnectRawTcp(segment_.data);
  std::thread trickle([slow] {
    uint8_t bytes[wire::kRequestHeaderSize];
    wire::EncodeRequest({.opcode = wire::Opcode::kPing}, bytes);
    for (size_t i = 0; i + 1 < sizeof(bytes); ++i) {
      if (send(slow, bytes + i, 1, MSG_NOSIGNAL) != 1) return;
      absl::SleepFor(absl::Milliseconds(200));
    }
  });
  absl::Time started = absl::Now();
  char byte;
  EXPECT_LE(recv(idle, &byte, 1, 0), 0) << "idle connection not closed";
  EXPECT_LE(recv(slow, &byte, 1, 0), 0) << "slow connection not closed";
  EXPECT_LT(absl::Now() - started, absl::Seconds(5));
  trickle.join();
  close(idle);
  close(slow);

  std::vector<int> many;
  for (int i = 0; i < 12; ++i) many.push_back(testing::ConnectRawTcp(segment_.data));
  ASSERT_TRUE(Eventually(
      [&] { return Metric("kvpool_data_rejected_total{reason=\"connection_cap\"}") >= 4; },
      absl::Seconds(5)));
  for (int fd : many) close(fd);
  EXPECT_GE(Metric("kvpool_data_rejected_total{reason=\"timeout\"}"), 2u);
}

// A local client that ftruncates the pool's memfd to 0 would kill the segment (SIGBUS): the
// memfd is sealed. Silent peers on the admission socket do not delay others.
int ConnectUnix(const std::string& path) {
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::memcpy(address.sun_path, path.data(), path.size());
  if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// The pool's memfd, through the admission handshake (-1 if refused).
int MapPoolFd(const std::string& path) {
  int fd = ConnectUnix(path);
  if (fd < 0) return -1;
  std::string hello = wire::EncodeShmHello();
  SendAll(fd, hello.data(), hello.size());
  char answer[wire::kShmAnswerSize + 1024];
  iovec iov{answer, sizeof(answer)};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr message{};
  message.msg_iov = &iov;
  message.msg_iovlen = 1;
  message.msg_control = control;
  message.msg_controllen = sizeof(control);
  int pool_fd = -1;
  if (recvmsg(fd, &message, 0) > 0) {
    if (cmsghdr* header = CMSG_FIRSTHDR(&message); header != nullptr) {
      std::memcpy(&pool_fd, CMSG_DATA(header), sizeof(int));
    }
  }
  close(fd);
  return pool_fd;
}

TEST_F(AttackTest, TruncatingThePoolThroughItsMemfdFails) {
  StartCluster();
  ASSERT_NE(segment_.shm, "none");
  const std::string value = testing::RandomValue(kSize, 11);
  ASSERT_TRUE(client_->Put("kept", value).ok());
  int pool = MapPoolFd(segment_.shm);
  ASSERT_GE(pool, 0);
  EXPECT_NE(ftruncate(pool, 0), 0);
  EXPECT_EQ(errno, EPERM);
  EXPECT_NE(ftruncate(pool, 1ll << 40), 0);  // nor grown
  close(pool);
  EXPECT_TRUE(client_->Get("kept").value_or("") == value);
}

TEST_F(AttackTest, SilentAdmissionPeersDoNotStallOthers) {
  StartCluster();
  std::vector<int> silent;
  for (int i = 0; i < 64; ++i) silent.push_back(ConnectUnix(segment_.shm));
  absl::Time started = absl::Now();
  int pool = MapPoolFd(segment_.shm);
  absl::Duration took = absl::Now() - started;
  EXPECT_GE(pool, 0);
  // Serialised behind them it would take 64 x 1 s.
  EXPECT_LT(took, absl::Milliseconds(900)) << "admission waited behind silent peers";
  if (pool >= 0) close(pool);
  for (int fd : silent) close(fd);
}

// --- Shared-memory writes are fenced by write intents ---
//
// A shared-memory writer copies straight into the mapped pool, so the segment cannot cut it;
// instead it accepts each write first (an intent on the kept admission connection) and holds
// the range until the writer says it is done or its connection closes. These attackers speak
// the intent protocol raw (proto/shm_handshake.h), with tokens from real placements.

// An admitted client: the kept admission connection and the mapped pool.
struct RawShmClient {
  int control = -1;
  uint8_t* base = nullptr;
  uint64_t size = 0;
  ~RawShmClient() {
    if (base != nullptr) munmap(base, size);
    if (control >= 0) close(control);
  }
};

std::unique_ptr<RawShmClient> AdmitShm(const std::string& path) {
  auto client = std::make_unique<RawShmClient>();
  client->control = ConnectUnix(path);
  if (client->control < 0) return nullptr;
  timeval timeout{10, 0};
  setsockopt(client->control, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  std::string hello = wire::EncodeShmHello();
  SendAll(client->control, hello.data(), hello.size());
  uint8_t answer[wire::kShmAnswerSize];
  iovec iov{answer, sizeof(answer)};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr message{};
  message.msg_iov = &iov;
  message.msg_iovlen = 1;
  message.msg_control = control;
  message.msg_controllen = sizeof(control);
  int pool_fd = -1;
  if (recvmsg(client->control, &message, MSG_WAITALL) != sizeof(answer)) return nullptr;
  if (cmsghdr* header = CMSG_FIRSTHDR(&message); header != nullptr) {
    std::memcpy(&pool_fd, CMSG_DATA(header), sizeof(int));
  }
  uint32_t reason_length = 0;
  absl::StatusOr<wire::ShmAnswer> decoded = wire::DecodeShmAnswer(answer, &reason_length);
  if (!decoded.ok() || decoded->status != 0 || pool_fd < 0) return nullptr;
  void* base = mmap(nullptr, decoded->pool_size, PROT_READ | PROT_WRITE, MAP_SHARED, pool_fd, 0);
  close(pool_fd);
  if (base == MAP_FAILED) return nullptr;
  client->base = static_cast<uint8_t*>(base);
  client->size = decoded->pool_size;
  return client;
}

// Sends one message and reads its answer of `count` entries (empty if the segment closed
// the connection instead).
std::vector<wire::ShmReply> SendShm(int control, const std::string& message, size_t count) {
  SendAll(control, message.data(), message.size());
  std::string answer(wire::kShmMessageHeaderSize + count * wire::kShmReplyEntrySize, '\0');
  if (recv(control, answer.data(), answer.size(), MSG_WAITALL) !=
      static_cast<ssize_t>(answer.size())) {
    return {};
  }
  const uint8_t* bytes = reinterpret_cast<const uint8_t*>(answer.data());
  absl::StatusOr<wire::ShmMessageHeader> header = wire::DecodeShmMessageHeader(bytes);
  if (!header.ok() || header->count != count) return {};
  return wire::DecodeShmReplies(*header, absl::MakeConstSpan(bytes, answer.size())
                                             .subspan(wire::kShmMessageHeaderSize))
      .value_or(std::vector<wire::ShmReply>{});
}

wire::ShmIntent IntentFor(const v1::Placement& placement) {
  wire::ShmIntent intent{placement.offset(), placement.length()};
  std::memcpy(intent.token.data(), placement.token().data(),
              std::min(intent.token.size(), placement.token().size()));
  return intent;
}

int32_t BeginOne(const RawShmClient& client, const v1::Placement& placement,
                 uint64_t* intent = nullptr) {
  std::vector<wire::ShmReply> replies =
      SendShm(client.control, wire::EncodeShmIntents({IntentFor(placement)}), 1);
  if (replies.size() != 1) return v1::RPC_FAIL;
  if (intent != nullptr) *intent = replies[0].intent;
  return replies[0].status;
}

int32_t DoneOne(const RawShmClient& client, uint64_t intent) {
  std::vector<wire::ShmReply> replies =
      SendShm(client.control, wire::EncodeShmDone({std::vector<uint64_t>{intent}}), 1);
  return replies.size() == 1 ? replies[0].status : v1::RPC_FAIL;
}

// A shared-memory writer paused between its intent and its bytes for longer than its
// reservation: the range is reclaimed, but the segment holds it busy and says so with the
// heartbeat that acknowledges the reclaim, so the master places nothing there: every other
// put into the same small pool is acknowledged, elsewhere, and the writer's late bytes
// overwrite nothing anyone was told is stored. Once the writer is done the range serves again.
TEST_F(AttackTest, ShmWriterPausedPastItsReservationLosesNoAcknowledgedObject) {
  StartCluster({"--put-timeout=2s"}, {}, "4MiB");
  ASSERT_NE(segment_.shm, "none");
  uint64_t baseline = Used();
  std::unique_ptr<RawShmClient> writer = AdmitShm(segment_.shm);
  ASSERT_NE(writer, nullptr);
  v1::PutStartResult mine = Reserve("paused", kSize);
  const uint64_t busy_at = mine.placements(0).offset();
  uint64_t intent = 0;
  ASSERT_EQ(BeginOne(*writer, mine.placements(0), &intent), v1::OK);
  ASSERT_NE(intent, 0u);

  // It pauses: the reservation expires, is reclaimed and its range no longer counted as used,
  // but held busy, at the segment and at the master.
  ASSERT_TRUE(Eventually([&] { return Used() == baseline; }, absl::Seconds(10)));
  EXPECT_EQ(Metric("kvpool_shm_busy_bytes"), kSize);
  EXPECT_GE(Metric("kvpool_segment_deferred_grant_ends_total"), 1u);
  EXPECT_EQ(MasterBusy(), kSize);
  EXPECT_EQ(MasterMetric("kvpool_segment_busy_bytes{segment=\"" + segment_.name + "\"}"), kSize);
  // Many puts into the 4 MiB pool, one after another (each first fit would be the busy
  // range): all acknowledged, none placed there, none refused by the segment.
  uint64_t refused_before = Metric("kvpool_data_busy_refused_total");
  PutOutside("other-", 12, busy_at, kSize, 100);
  EXPECT_EQ(Metric("kvpool_data_busy_refused_total"), refused_before);

  // The writer wakes, copies its bytes and says so; its commit finds its reservation gone.
  std::memset(writer->base + busy_at, 'P', kSize);
  EXPECT_EQ(DoneOne(*writer, intent), v1::OK);
  EXPECT_EQ(Commit("paused", mine.put_id(), 1), v1::OBJECT_NOT_FOUND);
  EXPECT_EQ(Metric("kvpool_shm_busy_bytes"), 0u);
  // The next heartbeat no longer lists the range: the master places there again (best fit:
  // the hole is exactly one object), and nothing of the old grant lands there again.
  ASSERT_TRUE(Eventually([&] { return MasterBusy() == 0; }, absl::Seconds(10)));
  const std::string value = testing::RandomValue(kSize, 21);
  ASSERT_TRUE(client_->Put("victim", value).ok());
  ASSERT_EQ(Locate("victim").replicas(0).offset(), busy_at);
  EXPECT_NE(BeginOne(*writer, mine.placements(0)), v1::OK);
  EXPECT_TRUE(client_->Get("victim").value_or("") == value);
  for (int i = 0; i < 12; ++i) {
    EXPECT_TRUE(client_->Get(absl::StrCat("other-", i)).value_or("") ==
                testing::RandomValue(kSize, 100 + i));
  }
}

// The master that placed a paused writer is replaced (a restart here; a fail-over to another
// leader is the same for the segment: a new term, whose grants know nothing of the old
// ones). The segment's mount on the new master reports the range busy, so the new master
// places nothing there while the old term's intent is open; once the writer is done the
// range serves again.
TEST_F(AttackTest, ShmIntentOpenAcrossANewMasterTermHoldsItsRange) {
  StartCluster({}, {}, "4MiB");
  std::unique_ptr<RawShmClient> writer = AdmitShm(segment_.shm);
  ASSERT_NE(writer, nullptr);
  v1::PutStartResult mine = Reserve("old-term", kSize);
  const uint64_t busy_at = mine.placements(0).offset();
  uint64_t intent = 0;
  ASSERT_EQ(BeginOne(*writer, mine.placements(0), &intent), v1::OK);
  RestartMaster();
  EXPECT_EQ(MasterBusy(), kSize);
  uint64_t refused_before = Metric("kvpool_data_busy_refused_total");
  PutOutside("new-term-", 8, busy_at, kSize, 200);
  EXPECT_EQ(Metric("kvpool_data_busy_refused_total"), refused_before);
  EXPECT_EQ(Metric("kvpool_shm_busy_bytes"), kSize);
  std::memset(writer->base + busy_at, 'T', kSize);  // its late bytes
  EXPECT_EQ(DoneOne(*writer, intent), v1::OK);
  ASSERT_TRUE(Eventually([&] { return MasterBusy() == 0; }, absl::Seconds(10)));
  const std::string value = testing::RandomValue(kSize, 28);
  ASSERT_TRUE(client_->Put("victim", value).ok());
  EXPECT_EQ(Locate("victim").replicas(0).offset(), busy_at);
  EXPECT_NE(BeginOne(*writer, mine.placements(0)), v1::OK);
  EXPECT_TRUE(client_->Get("victim").value_or("") == value);
}

// A writer stalled between its placement and its intent: on waking its intent is refused,
// so it copies nothing over the object committed meanwhile.
TEST_F(AttackTest, ShmWriterStalledBeforeItsIntentIsRefusedOnWaking) {
  StartCluster();
  uint64_t baseline = Used();
  std::unique_ptr<RawShmClient> writer = AdmitShm(segment_.shm);
  ASSERT_NE(writer, nullptr);
  v1::PutStartResult mine = Reserve("stalled", kSize);
  ASSERT_EQ(Revoke("stalled", mine.put_id()), v1::OK);
  ASSERT_TRUE(Eventually([&] { return Used() == baseline; }, absl::Seconds(5)));
  const std::string value = testing::RandomValue(kSize, 22);
  ASSERT_TRUE(client_->Put("victim", value).ok());
  ASSERT_EQ(Locate("victim").replicas(0).offset(), mine.placements(0).offset());
  uint64_t intent = 7;
  EXPECT_EQ(BeginOne(*writer, mine.placements(0), &intent), v1::PERMISSION_DENIED);
  EXPECT_EQ(intent, 0u);
  EXPECT_GE(Metric("kvpool_shm_write_intents_total{result=\"refused\"}"), 1u);
  EXPECT_TRUE(client_->Get("victim").value_or("") == value);
}

// A writer process killed between its intent and its done: its connection closes with it,
// which ends its intents, and the range serves the next put.
TEST_F(AttackTest, ShmClientKilledMidIntentReleasesItsRange) {
  StartCluster();
  uint64_t baseline = Used();
  v1::PutStartResult mine = Reserve("killed", kSize);
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  pid_t child = fork();
  if (child == 0) {
    std::unique_ptr<RawShmClient> writer = AdmitShm(segment_.shm);
    char begun = writer != nullptr && BeginOne(*writer, mine.placements(0)) == v1::OK;
    ssize_t ignored = write(ready[1], &begun, 1);
    (void)ignored;
    pause();  // killed here, mid-intent
    _exit(0);
  }
  ASSERT_GT(child, 0);
  char begun = 0;
  ASSERT_EQ(read(ready[0], &begun, 1), 1);
  close(ready[0]);
  close(ready[1]);
  ASSERT_EQ(begun, 1);
  ASSERT_EQ(Revoke("killed", mine.put_id()), v1::OK);
  ASSERT_TRUE(Eventually([&] { return Used() == baseline; }, absl::Seconds(5)));
  const uint64_t busy_at = mine.placements(0).offset();
  EXPECT_EQ(MasterBusy(), kSize);
  PutOutside("while-held-", 4, busy_at, kSize, 300);

  kill(child, SIGKILL);
  ASSERT_EQ(waitpid(child, nullptr, 0), child);
  ASSERT_TRUE(Eventually([&] { return Metric("kvpool_shm_write_intents_open") == 0; },
                         absl::Seconds(5)));
  EXPECT_EQ(Metric("kvpool_shm_busy_bytes"), 0u);
  ASSERT_TRUE(Eventually([&] { return MasterBusy() == 0; }, absl::Seconds(10)));
  const std::string value = testing::RandomValue(kSize, 23);
  ASSERT_TRUE(client_->Put("victim", value).ok());
  EXPECT_EQ(Locate("victim").replicas(0).offset(), busy_at);
  EXPECT_TRUE(client_->Get("victim").value_or("") == value);
}

// Bogus intents (forged, stretched, outside the pool, another range's token, an earlier
// term's, a range busy with another grant's intent) and dones are refused one by one; a
// malformed message closes the connection, ending its intents. Nothing else changes.
TEST_F(AttackTest, BogusShmIntentsAreRefusedAndChangeNothing) {
  StartCluster();
  const std::string kept = testing::RandomValue(kSize, 24);
  ASSERT_TRUE(client_->Put("kept", kept).ok());
  std::unique_ptr<RawShmClient> attacker = AdmitShm(segment_.shm);
  ASSERT_NE(attacker, nullptr);
  v1::PutStartResult open = Reserve("open", kSize);
  wire::ShmIntent forged = IntentFor(open.placements(0));
  forged.token[20] ^= 1;
  wire::ShmIntent stretched = IntentFor(open.placements(0));
  stretched.length += 1;
  wire::ShmIntent outside = IntentFor(open.placements(0));
  outside.offset = uint64_t{1} << 50;
  wire::ShmIntent over_kept = IntentFor(open.placements(0));
  over_kept.offset = Locate("kept").replicas(0).offset();
  std::vector<wire::ShmReply> replies = SendShm(
      attacker->control, wire::EncodeShmIntents({forged, stretched, outside, over_kept}), 4);
  ASSERT_EQ(replies.size(), 4u);
  EXPECT_EQ(replies[0].status, v1::PERMISSION_DENIED);
  EXPECT_EQ(replies[1].status, v1::PERMISSION_DENIED);
  EXPECT_EQ(replies[2].status, v1::INVALID_WRITE);
  EXPECT_EQ(replies[3].status, v1::PERMISSION_DENIED);
  for (const wire::ShmReply& reply : replies) EXPECT_EQ(reply.intent, 0u);
  EXPECT_EQ(DoneOne(*attacker, 42), v1::INVALID_PARAMS);  // never given
  ASSERT_EQ(Revoke("open", open.put_id()), v1::OK);

  // A token of the master's previous term (the segment mounted again since).
  v1::PutStartResult stale = Reserve("stale", kSize);
  RestartMaster();
  EXPECT_EQ(BeginOne(*attacker, stale.placements(0)), v1::PERMISSION_DENIED);

  // An intent of a revoked grant holds its range: the master, told by the heartbeat that
  // acknowledged the revoke, places the next reservation elsewhere, and the revoked grant's
  // token writes nothing by TCP either.
  uint64_t before = Used();
  v1::PutStartResult first = Reserve("first", kSize);
  uint64_t held = 0;
  ASSERT_EQ(BeginOne(*attacker, first.placements(0), &held), v1::OK);
  ASSERT_EQ(Revoke("first", first.put_id()), v1::OK);
  ASSERT_TRUE(Eventually([&] { return Used() == before; }, absl::Seconds(5)));
  EXPECT_EQ(MasterBusy(), kSize);
  v1::PutStartResult second = Reserve("second", kSize);
  const uint64_t busy_at = first.placements(0).offset();
  EXPECT_TRUE(second.placements(0).offset() + kSize <= busy_at ||
              busy_at + kSize <= second.placements(0).offset());
  const std::string value = testing::RandomValue(kSize, 25);
  EXPECT_EQ(RawWrite(segment_.data, first.placements(0), value).first, v1::PERMISSION_DENIED);

  // A malformed message: the connection is closed, which ends the held intent.
  const std::string garbage(wire::kShmMessageHeaderSize, 'x');
  SendAll(attacker->control, garbage.data(), garbage.size());
  char byte;
  EXPECT_EQ(recv(attacker->control, &byte, 1, 0), 0);
  ASSERT_TRUE(Eventually([&] { return Metric("kvpool_shm_write_intents_open") == 0; },
                         absl::Seconds(5)));
  ASSERT_TRUE(Eventually([&] { return MasterBusy() == 0; }, absl::Seconds(10)));
  ASSERT_EQ(RawWrite(segment_.data, second.placements(0), value).first, v1::OK);
  iovec iov{const_cast<char*>(value.data()), value.size()};
  EXPECT_EQ(Commit("second", second.put_id(), wire::Checksum({&iov, 1})), v1::OK);
  EXPECT_TRUE(client_->Get("second").value_or("") == value);
  EXPECT_TRUE(client_->Get("kept").value_or("") == kept);
}

// The zero-copy put (Client::BatchReserveLocal: the caller fills the pool itself) is fenced
// the same way: a reservation held past its deadline keeps its range from the next put
// until it is committed or abandoned. A normal shared-memory put is checked at commit by its
// done intent, not by hashing its range.
TEST_F(AttackTest, ZeroCopyReservationHeldPastItsDeadlineLosesNoAcknowledgedObject) {
  StartCluster({"--put-timeout=2s"});
  uint64_t baseline = Used();
  ClientOptions options;
  options.master_address = master_.grpc;
  options.transport = TransportKind::kSharedMemory;
  options.cache_locations = false;
  std::unique_ptr<Client> local = std::move(Client::Create(options).value());
  uint64_t hashed = Metric("kvpool_segment_commit_checks_total{how=\"hashed\"}");
  const std::string mine = testing::RandomValue(kSize, 26);
  ASSERT_TRUE(local->Put("by-shm", mine).ok());
  EXPECT_EQ(Metric("kvpool_segment_commit_checks_total{how=\"intent\"}"), 1u);
  EXPECT_EQ(Metric("kvpool_segment_commit_checks_total{how=\"hashed\"}"), hashed);
  EXPECT_TRUE(client_->Get("by-shm").value_or("") == mine);
  ASSERT_TRUE(local->Remove("by-shm", /*force=*/true).ok());  // leased by the read above
  ASSERT_TRUE(Eventually([&] { return Used() == baseline; }, absl::Seconds(5)));

  std::vector<absl::StatusOr<LocalReservation>> reserved =
      local->BatchReserveLocal({"zero-copy"}, {std::vector<uint64_t>{kSize}});
  ASSERT_TRUE(reserved[0].ok()) << reserved[0].status();
  EXPECT_NE(reserved[0]->write_intent, 0u);
  // Held past its deadline: reclaimed, but held busy: the next put goes elsewhere.
  ASSERT_TRUE(Eventually([&] { return Used() == baseline; }, absl::Seconds(10)));
  EXPECT_EQ(MasterBusy(), kSize);
  const std::string value = testing::RandomValue(kSize, 27);
  ASSERT_TRUE(client_->Put("victim", value).ok());
  // The late writer fills its reservation and commits: too late, nothing lost.
  std::memset(reserved[0]->data, 'Z', kSize);
  EXPECT_EQ(ToErrorCode(local->BatchCommitLocal({*reserved[0]})[0]), v1::OBJECT_NOT_FOUND);
  // Its intent is done with the commit: the range is no longer reported busy.
  ASSERT_TRUE(Eventually([&] { return MasterBusy() == 0; }, absl::Seconds(10)));
  EXPECT_TRUE(client_->Get("victim").value_or("") == value);
  EXPECT_TRUE(local->Get("victim").value_or("") == value);
}

// Two servers on one address: the second fails at start-up with a clear error instead of
// sharing the port (SO_REUSEPORT) and splitting the clients.
TEST(StartUpTest, SecondServersOnTakenAddressesFailFast) {
  absl::StatusOr<MasterProcess> first = testing::StartMaster({"--embedded-segment-size=0"});
  ASSERT_TRUE(first.ok()) << first.status();
  absl::StatusOr<std::unique_ptr<testing::Process>> second = testing::Process::Start(
      testing::MasterBinary(),
      {"--listen=" + first->grpc, "--http-listen=127.0.0.1:0", "--embedded-segment-size=0"});
  ASSERT_TRUE(second.ok());
  int status = (*second)->Wait();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) != 0) << "a second master started";

  absl::StatusOr<SegmentProcess> segment = testing::StartSegment(first->grpc, "8MiB");
  ASSERT_TRUE(segment.ok()) << segment.status();
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"--listen=" + segment->data, "--http-listen=127.0.0.1:0"},
        std::vector<std::string>{"--listen=127.0.0.1:0", "--http-listen=" + segment->http},
        std::vector<std::string>{"--listen=127.0.0.1:0", "--http-listen=127.0.0.1:0",
                                 "--shm-socket=" + segment->shm}}) {
    std::vector<std::string> all = {"--master=" + first->grpc, "--size=8MiB", "--prefault=false"};
    all.insert(all.end(), args.begin(), args.end());
    absl::StatusOr<std::unique_ptr<testing::Process>> other =
        testing::Process::Start(testing::SegmentBinary(), all);
    ASSERT_TRUE(other.ok());
    int other_status = (*other)->Wait();
    EXPECT_TRUE(WIFEXITED(other_status) && WEXITSTATUS(other_status) != 0)
        << "a second segment started with " << args[0] << " " << args[1];
  }
  // The first ones still serve.
  ClientOptions options;
  options.master_address = first->grpc;
  std::unique_ptr<Client> client = std::move(Client::Create(options).value());
  ASSERT_TRUE(client->Put("k", "v").ok());
  EXPECT_EQ(client->Get("k").value_or(""), "v");
}

}  // namespace
}  // namespace kvpool
