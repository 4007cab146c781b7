// TLS on the data plane (issue 14), against real kvpool-master and kvpool-segment processes:
// a segment started with --data-tls serves its TCP data port only over TLS. A plaintext
// client and a client that does not trust the segment's certificate move no byte; the right
// client moves the right bytes (small and large values, single and batched, checksums on);
// mutual TLS refuses a client without a certificate; a peer that garbles or stalls the
// handshake is cut off without holding up anyone else. Certificates are made at test time
// (tests/harness/pki.h).

#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "kvpool/client.h"
#include "tests/harness/cluster.h"
#include "tests/harness/eventually.h"
#include "tests/harness/http_get.h"
#include "tests/harness/pki.h"
#include "tests/harness/raw_tcp.h"
#include "tests/harness/values.h"

namespace kvpool {
namespace {

using testing::MasterProcess;
using testing::SegmentProcess;

constexpr char kEngine[] = "engine-a-token-0000000001";
constexpr char kSegment1[] = "segment-1-token-00000003";
constexpr char kSegment2[] = "segment-2-token-00000004";

std::string WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  return path;
}

// The value of a /metrics sample, e.g. `kvpool_data_rejected_total{reason="tls_handshake"}`;
// -1 if absent.
double Sample(const std::string& http, const std::string& name) {
  absl::StatusOr<std::string> body = testing::HttpGet(http, "/metrics");
  if (!body.ok()) return -1;
  for (absl::string_view line : absl::StrSplit(*body, '\n')) {
    if (absl::StartsWith(line, name + " ")) {
      double value = -1;
      if (absl::SimpleAtod(line.substr(name.size() + 1), &value)) return value;
    }
  }
  return -1;
}

const char kHandshakeRefusals[] = "kvpool_data_rejected_total{reason=\"tls_handshake\"}";

// Whether the sample reaches `at_least` within a few seconds. A handshake that the client
// gives up (it does not trust the certificate) ends on the client first: the segment counts
// it when it reads the client's alert, which may be after the client's call has returned.
bool SampleReaches(const std::string& http, const std::string& name, double at_least) {
  return testing::Eventually([&] { return Sample(http, name) >= at_least; }, absl::Seconds(5));
}

class DataTlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = absl::StrCat(::testing::TempDir(), "/kvpool-data-tls-", getpid());
    mkdir(dir_.c_str(), 0700);
    absl::StatusOr<testing::TestCa> pool = testing::TestCa::Create(dir_, "pool");
    ASSERT_TRUE(pool.ok()) << pool.status();
    pool_ca_ = *pool;
    absl::StatusOr<testing::TestCa> rogue = testing::TestCa::Create(dir_, "rogue");
    ASSERT_TRUE(rogue.ok()) << rogue.status();
    rogue_ca_ = *rogue;
    absl::StatusOr<testing::CertFiles> server = pool_ca_.Issue("master");
    ASSERT_TRUE(server.ok()) << server.status();
    master_cert_ = *server;
    tokens_ = WriteFile(dir_ + "/tokens",
                                   absl::StrCat("token ", kEngine, " engine-a engine team-a\n",
                                                "token ", kSegment1, " seg-1 segment\n",
                                                "token ", kSegment2, " seg-2 segment\n"));
    absl::StatusOr<MasterProcess> master = testing::StartMaster(
        {"--embedded-segment-size=0", "--auth-tokens=" + tokens_, "--tls-cert=" + server->cert,
         "--tls-key=" + server->key});
    ASSERT_TRUE(master.ok()) << master.status();
    master_ = std::move(*master);
  }

  // A segment serving --data-tls with a certificate of `ca` (the master link trusts the
  // pool's CA whatever `ca` is); that certificate's files in `*issued` if given.
  absl::StatusOr<SegmentProcess> StartTlsSegment(const std::string& name, const char* token,
                                                 const testing::TestCa& ca,
                                                 std::vector<std::string> extra = {},
                                                 testing::CertFiles* issued = nullptr) {
    absl::StatusOr<testing::CertFiles> cert = ca.Issue(name);
    if (!cert.ok()) return cert.status();
    if (issued != nullptr) *issued = *cert;
    std::vector<std::string> args = {
        "--name=" + name,
        "--auth-token-file=" + WriteFile(absl::StrCat(dir_, "/", name, ".token"), token),
        "--tls-ca=" + pool_ca_.ca_file(), "--tls-cert=" + cert->cert, "--tls-key=" + cert->key,
        "--data-tls", "--request-timeout=2s"};
    args.insert(args.end(), extra.begin(), extra.end());
    return testing::StartSegment(master_.grpc, "64MiB", args);
  }

  absl::StatusOr<std::unique_ptr<Client>> Connect(bool data_tls,
                                                  const testing::CertFiles& cert = {}) {
    ClientOptions options;
    options.master_address = master_.grpc;
    options.transport = TransportKind::kTcp;
    options.tls_ca_file = pool_ca_.ca_file();
    options.tls_cert_file = cert.cert;
    options.tls_key_file = cert.key;
    options.auth_token = kEngine;
    options.data_tls = data_tls;
    options.transfer_timeout = absl::Seconds(10);
    return Client::Create(options);
  }

  std::string dir_;
  std::string tokens_;
  testing::CertFiles master_cert_;
  testing::TestCa pool_ca_;
  testing::TestCa rogue_ca_;
  MasterProcess master_;
};

TEST_F(DataTlsTest, MovesTheRightBytesSmallLargeAndBatched) {
  absl::StatusOr<SegmentProcess> segment = StartTlsSegment("seg-1", kSegment1, pool_ca_);
  ASSERT_TRUE(segment.ok()) << segment.status();
  absl::StatusOr<std::unique_ptr<Client>> client = Connect(/*data_tls=*/true);
  ASSERT_TRUE(client.ok()) << client.status();
  Client& c = **client;
  for (size_t size : {1ul, 100ul, 4096ul, 16384ul + 7, 1ul << 20, (4ul << 20) + 3}) {
    std::string key = absl::StrCat("single-", size);
    std::string value = testing::RandomValue(size, static_cast<uint32_t>(size));
    ASSERT_TRUE(c.Put(key, value).ok()) << size;
    absl::StatusOr<std::string> got = c.Get(key, {.verify_checksum = true});
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_TRUE(*got == value) << "value of " << size << " bytes differs";
  }
  // A batch of 32 x 512 KiB and one of 64 x 4 KiB: many requests pipelined on each
  // connection, each answer checked byte for byte.
  for (auto [count, size] : {std::pair{32, 512ul << 10}, std::pair{64, 4096ul}}) {
    std::vector<std::string> keys, values;
    std::vector<PutItem> items;
    for (int i = 0; i < count; ++i) {
      keys.push_back(absl::StrCat("batch-", size, "-", i));
      values.push_back(testing::RandomValue(size, static_cast<uint32_t>(1000 + i)));
    }
    for (int i = 0; i < count; ++i) {
      items.push_back({keys[i], {ConstBuffer{values[i].data(), values[i].size()}}});
    }
    for (const absl::Status& put : c.BatchPut(items)) ASSERT_TRUE(put.ok()) << put;
    std::vector<std::string> read(count, std::string(size, '\0'));
    std::vector<GetItem> gets;
    for (int i = 0; i < count; ++i) {
      gets.push_back({keys[i], {MutableBuffer{read[i].data(), read[i].size()}}});
    }
    std::vector<absl::StatusOr<uint64_t>> got = c.BatchGet(gets, {.verify_checksum = true});
    for (int i = 0; i < count; ++i) {
      ASSERT_TRUE(got[i].ok()) << got[i].status();
      EXPECT_EQ(*got[i], size);
      EXPECT_TRUE(read[i] == values[i]) << keys[i] << " differs";
    }
  }
  EXPECT_EQ(Sample(segment->http, kHandshakeRefusals), 0);
}

TEST_F(DataTlsTest, APlaintextClientMovesNoByte) {
  absl::StatusOr<SegmentProcess> segment = StartTlsSegment("seg-1", kSegment1, pool_ca_);
  ASSERT_TRUE(segment.ok()) << segment.status();
  absl::StatusOr<std::unique_ptr<Client>> good = Connect(true);
  ASSERT_TRUE(good.ok()) << good.status();
  ASSERT_TRUE((*good)->Put("stored", "bytes over TLS").ok());

  // Plaintext against the TLS port: the handshake fails on the segment, nothing is stored
  // or served.
  absl::StatusOr<std::unique_ptr<Client>> plain = Connect(false);
  ASSERT_TRUE(plain.ok()) << plain.status();
  absl::Status put = (*plain)->Put("plain", "never stored");
  EXPECT_FALSE(put.ok());
  EXPECT_EQ(put.code(), absl::StatusCode::kUnavailable) << put;
  absl::StatusOr<std::string> read = (*plain)->Get("stored");
  EXPECT_FALSE(read.ok());
  EXPECT_GE(Sample(segment->http, kHandshakeRefusals), 2);
  EXPECT_EQ((*good)->Exists("plain").value_or(true), false);
  EXPECT_EQ((*good)->Get("stored").value_or(""), "bytes over TLS");
}

TEST_F(DataTlsTest, AClientThatDoesNotTrustTheSegmentsCertificateMovesNoByte) {
  // The segment's data-plane certificate is signed by another CA than the client trusts.
  absl::StatusOr<SegmentProcess> rogue = StartTlsSegment("seg-2", kSegment2, rogue_ca_);
  ASSERT_TRUE(rogue.ok()) << rogue.status();
  absl::StatusOr<std::unique_ptr<Client>> client = Connect(true);
  ASSERT_TRUE(client.ok()) << client.status();
  absl::Status refused = (*client)->Put("to-rogue", "never sent");
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable) << refused;
  EXPECT_TRUE(absl::StrContains(refused.message(), "certificate")) << refused;
  EXPECT_EQ((*client)->Exists("to-rogue").value_or(true), false);
  // The client gave up in the handshake: the segment saw no request.
  EXPECT_TRUE(SampleReaches(rogue->http, kHandshakeRefusals, 1));
  EXPECT_EQ(Sample(rogue->http, "kvpool_data_requests_total{op=\"write\",transport=\"tcp\"}"),
            0);
}

TEST_F(DataTlsTest, MutualTlsRefusesAClientWithoutACertificate) {
  absl::StatusOr<SegmentProcess> segment = StartTlsSegment(
      "seg-1", kSegment1, pool_ca_,
      {"--data-tls-client-ca=" + pool_ca_.ca_file(), "--data-tls-require-client-cert"});
  ASSERT_TRUE(segment.ok()) << segment.status();
  absl::StatusOr<std::unique_ptr<Client>> anonymous = Connect(true);
  ASSERT_TRUE(anonymous.ok()) << anonymous.status();
  EXPECT_FALSE((*anonymous)->Put("k", "no certificate").ok());
  absl::StatusOr<testing::CertFiles> forged = rogue_ca_.Issue("engine-a");
  ASSERT_TRUE(forged.ok());
  absl::StatusOr<std::unique_ptr<Client>> wrong = Connect(true, *forged);
  // The master (no client CA) does not ask for the certificate; the segment refuses it.
  ASSERT_TRUE(wrong.ok()) << wrong.status();
  EXPECT_FALSE((*wrong)->Put("k", "certificate of another CA").ok());
  absl::StatusOr<testing::CertFiles> cert = pool_ca_.Issue("engine-a");
  ASSERT_TRUE(cert.ok());
  absl::StatusOr<std::unique_ptr<Client>> mutual = Connect(true, *cert);
  ASSERT_TRUE(mutual.ok()) << mutual.status();
  ASSERT_TRUE((*mutual)->Put("k", "with a certificate").ok());
  EXPECT_EQ((*mutual)->Get("k").value_or(""), "with a certificate");
  EXPECT_GE(Sample(segment->http, kHandshakeRefusals), 2);
}

TEST_F(DataTlsTest, TheMastersEmbeddedSegmentServesItsDataPortOverTls) {
  std::vector<std::string> args = {"--auth-tokens=" + tokens_,
                                   "--tls-cert=" + master_cert_.cert,
                                   "--tls-key=" + master_cert_.key,
                                   "--embedded-segment-size=16MiB", "--prefault=false",
                                   "--embedded-segment-data-tls"};
  absl::StatusOr<MasterProcess> master = testing::StartMaster(args);
  ASSERT_TRUE(master.ok()) << master.status();
  ASSERT_NE(master->embedded_segment, "none");
  master_ = std::move(*master);  // the pool is now this master's embedded segment alone
  absl::StatusOr<std::unique_ptr<Client>> client = Connect(/*data_tls=*/true);
  ASSERT_TRUE(client.ok()) << client.status();
  std::string value = testing::RandomValue((1 << 20) + 5, 21);
  ASSERT_TRUE((*client)->Put("embedded", value).ok());
  EXPECT_TRUE((*client)->Get("embedded", {.verify_checksum = true}).value_or("") == value);

  absl::StatusOr<std::unique_ptr<Client>> plain = Connect(/*data_tls=*/false);
  ASSERT_TRUE(plain.ok()) << plain.status();
  absl::Status put = (*plain)->Put("plain", "never stored");
  EXPECT_EQ(put.code(), absl::StatusCode::kUnavailable) << put;
  EXPECT_FALSE((*plain)->Get("embedded").ok());
  EXPECT_EQ((*client)->Exists("plain").value_or(true), false);

  // Without a certificate to present it does not start.
  args.erase(args.begin() + 1, args.begin() + 3);
  EXPECT_FALSE(testing::StartMaster(args).ok());
}

TEST_F(DataTlsTest, ARotatedSegmentCertificateIsServedWithoutARestart) {
  testing::CertFiles live;
  absl::StatusOr<SegmentProcess> segment = StartTlsSegment(
      "seg-1", kSegment1, pool_ca_, {"--tls-reload-interval=1s"}, &live);
  ASSERT_TRUE(segment.ok()) << segment.status();
  std::string before = testing::RandomValue(300 << 10, 11);
  {
    absl::StatusOr<std::unique_ptr<Client>> client = Connect(true);
    ASSERT_TRUE(client.ok()) << client.status();
    ASSERT_TRUE((*client)->Put("before", before).ok());
  }
  // Each attempt is a new client, so its data connection is a new one.
  auto fresh_put = [&](const std::string& key) -> absl::Status {
    absl::StatusOr<std::unique_ptr<Client>> client = Connect(true);
    if (!client.ok()) return client.status();
    return (*client)->Put(key, "after rotation");
  };

  // A replacement that does not load (another CA's certificate under the old key) is logged
  // and the old certificate stays in use.
  absl::StatusOr<testing::CertFiles> rogue = rogue_ca_.Issue("seg-1");
  ASSERT_TRUE(rogue.ok());
  ASSERT_EQ(rename(rogue->cert.c_str(), live.cert.c_str()), 0);
  absl::SleepFor(absl::Milliseconds(1500));  // past the reload interval
  EXPECT_TRUE(fresh_put("during-mismatch").ok());

  // With its key it loads: new connections get the rogue certificate, which the clients
  // refuse. Then a new certificate of the pool's CA is served, without a restart.
  ASSERT_EQ(rename(rogue->key.c_str(), live.key.c_str()), 0);
  absl::Status refused;
  std::string refused_key;
  int attempt = 0;
  EXPECT_TRUE(testing::Eventually(
      [&] {
        refused_key = absl::StrCat("to-rogue-", ++attempt);  // until the reload: stored
        refused = fresh_put(refused_key);
        return !refused.ok();
      },
      absl::Seconds(20)));
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable) << refused;
  EXPECT_TRUE(absl::StrContains(refused.message(), "certificate")) << refused;
  absl::StatusOr<testing::CertFiles> next = pool_ca_.Issue("seg-1-next");
  ASSERT_TRUE(next.ok());
  ASSERT_EQ(rename(next->key.c_str(), live.key.c_str()), 0);
  ASSERT_EQ(rename(next->cert.c_str(), live.cert.c_str()), 0);
  EXPECT_TRUE(testing::Eventually([&] { return fresh_put("after").ok(); }, absl::Seconds(20)));
  absl::StatusOr<std::unique_ptr<Client>> client = Connect(true);
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_TRUE((*client)->Get("before", {.verify_checksum = true}).value_or("") == before);
  EXPECT_EQ((*client)->Get("after").value_or(""), "after rotation");
  EXPECT_EQ((*client)->Exists(refused_key).value_or(true), false);
  EXPECT_TRUE(SampleReaches(segment->http, kHandshakeRefusals, 1));
}

TEST_F(DataTlsTest, AMalformedOrStalledHandshakeDoesNotStallTheServer) {
  absl::StatusOr<SegmentProcess> segment = StartTlsSegment("seg-1", kSegment1, pool_ca_);
  ASSERT_TRUE(segment.ok()) << segment.status();
  // A TLS record header announcing a ClientHello that never comes, a garbled record, and a
  // connection that sends nothing at all, all held open.
  int stalled = testing::ConnectRawTcp(segment->data, absl::Seconds(10));
  ASSERT_GE(stalled, 0);
  const unsigned char partial_hello[] = {0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc};
  ASSERT_EQ(send(stalled, partial_hello, sizeof(partial_hello), MSG_NOSIGNAL),
            static_cast<ssize_t>(sizeof(partial_hello)));
  int garbled = testing::ConnectRawTcp(segment->data, absl::Seconds(10));
  ASSERT_GE(garbled, 0);
  const char garbage[] = "\x16\x03\x03\x00\x05hello, this is not a ClientHello at all";
  ASSERT_GT(send(garbled, garbage, sizeof(garbage), MSG_NOSIGNAL), 0);
  int silent = testing::ConnectRawTcp(segment->data, absl::Seconds(10));
  ASSERT_GE(silent, 0);

  // Meanwhile a real client is served at once.
  absl::StatusOr<std::unique_ptr<Client>> client = Connect(true);
  ASSERT_TRUE(client.ok()) << client.status();
  absl::Time start = absl::Now();
  std::string value = testing::RandomValue(256 << 10, 7);
  ASSERT_TRUE((*client)->Put("while-stalled", value).ok());
  EXPECT_TRUE((*client)->Get("while-stalled").value_or("") == value);
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));

  // The garbled one is refused at once, the stalled ones within --request-timeout (2 s):
  // each read sees the connection closed (0 or an error), not the 10 s receive timeout.
  for (int fd : {garbled, stalled, silent}) {
    absl::Time waited = absl::Now();
    char buffer[256];
    ssize_t n;
    do {
      n = recv(fd, buffer, sizeof(buffer), 0);
    } while (n > 0);  // a TLS alert may come first
    EXPECT_LT(absl::Now() - waited, absl::Seconds(6)) << "fd " << fd;
    close(fd);
  }
  EXPECT_GE(Sample(segment->http, kHandshakeRefusals), 1);
  EXPECT_GE(Sample(segment->http, "kvpool_data_rejected_total{reason=\"timeout\"}"), 2);
  EXPECT_EQ((*client)->Get("while-stalled").value_or("") == value, true);
}

}  // namespace
}  // namespace kvpool
