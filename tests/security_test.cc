// Nobody gets in who does not belong (issue 14), against real kvpool-master and
// kvpool-segment processes: every role against every RPC, strangers without credentials,
// tokens of other roles and tenants, segments impersonating others, the attacks that owned
// the pool before (RemoveAll(force), DrainSegment, fake and hijacking MountSegment,
// RestoreManifest and heartbeats for a live segment), TLS with a wrong CA, an expired
// certificate, certificate identities and rotation, and the safe defaults of binding.
// Certificates are made at test time with the openssl CLI (tests/harness/pki.h).

#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/net.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "kvpool/client.h"
#include "kvpool/v1/master.grpc.pb.h"
#include "proto/channel.h"
#include "proto/frame.h"
#include "proto/tls.h"
#include "tests/harness/cluster.h"
#include "tests/harness/eventually.h"
#include "tests/harness/http_get.h"
#include "tests/harness/pki.h"
#include "tests/harness/raw_tcp.h"

namespace kvpool {
namespace {

using testing::Eventually;
using testing::MasterProcess;
using testing::SegmentProcess;

// The master's refusals of RPCs, before the method and reason labels.
constexpr char kGrpcRefusals[] = "kvpool_auth_refusals_total{surface=\"grpc\",";

// Tokens of the test pool (at least 16 characters, as the master demands).
constexpr char kEngineA[] = "engine-a-token-0000000001";
constexpr char kEngineB[] = "engine-b-token-0000000002";
constexpr char kSegment1[] = "segment-1-token-00000003";
constexpr char kSegment2[] = "segment-2-token-00000004";
constexpr char kSegmentIdle[] = "segment-idle-token-00005";
constexpr char kAdmin[] = "admin-token-000000000006";
constexpr char kReader[] = "reader-token-00000000007";

std::string TestDir() {
  std::string dir = absl::StrCat(::testing::TempDir(), "/kvpool-security-", getpid());
  mkdir(dir.c_str(), 0700);
  return dir;
}

std::string WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  return path;
}

std::string TokenRules() {
  return absl::StrCat("token ", kEngineA, " engine-a engine team-a\n",  //
                      "token ", kEngineB, " engine-b engine team-b\n",  //
                      "token ", kSegment1, " seg-1 segment\n",          //
                      "token ", kSegment2, " seg-2 segment\n",          //
                      "token ", kSegmentIdle, " seg-idle segment\n",    //
                      "token ", kAdmin, " ops admin\n",                 //
                      "token ", kReader, " grafana reader\n",           //
                      "cert engine-c engine team-c\n",                  //
                      "cert seg-tls segment\n");
}

// One call of each RPC of MasterService, with a request that harms nothing when allowed
// (empty batches, unknown names) except through the segment name it acts on.
using RpcCall = std::function<grpc::Status(v1::MasterService::Stub&, grpc::ClientContext*,
                                           const std::string& segment)>;

const std::map<std::string, RpcCall>& AllRpcs() {
  static const auto* calls = new std::map<std::string, RpcCall>{
      {"MountSegment",
       [](auto& stub, auto* context, const std::string& segment) {
         v1::MountSegmentRequest request;
         request.set_name(segment);  // no endpoint: InvalidArgument once admitted
         v1::MountSegmentResponse response;
         return stub.MountSegment(context, request, &response);
       }},
      {"RestoreManifest",
       [](auto& stub, auto* context, const std::string& segment) {
         v1::RestoreManifestRequest request;
         request.set_name(segment);
         request.set_incarnation(12345);  // not the live one
         v1::RestoreManifestResponse response;
         return stub.RestoreManifest(context, request, &response);
       }},
      {"UnmountSegment",
       [](auto& stub, auto* context, const std::string& segment) {
         v1::UnmountSegmentRequest request;
         request.set_name(segment);
         request.set_incarnation(12345);
         v1::UnmountSegmentResponse response;
         return stub.UnmountSegment(context, request, &response);
       }},
      {"Heartbeat",
       [](auto& stub, auto* context, const std::string& segment) {
         v1::HeartbeatRequest request;
         request.set_name(segment);
         request.set_incarnation(12345);
         v1::HeartbeatResponse response;
         return stub.Heartbeat(context, request, &response);
       }},
      {"BatchPutStart",
       [](auto& stub, auto* context, const std::string&) {
         v1::BatchPutStartRequest request;
         v1::BatchPutStartResponse response;
         return stub.BatchPutStart(context, request, &response);
       }},
      {"BatchPutEnd",
       [](auto& stub, auto* context, const std::string&) {
         v1::BatchPutEndRequest request;
         v1::BatchPutEndResponse response;
         return stub.BatchPutEnd(context, request, &response);
       }},
      {"BatchPutRevoke",
       [](auto& stub, auto* context, const std::string&) {
         v1::BatchPutRevokeRequest request;
         v1::BatchPutRevokeResponse response;
         return stub.BatchPutRevoke(context, request, &response);
       }},
      {"BatchGetReplicaList",
       [](auto& stub, auto* context, const std::string&) {
         v1::BatchGetReplicaListRequest request;
         v1::BatchGetReplicaListResponse response;
         return stub.BatchGetReplicaList(context, request, &response);
       }},
      {"BatchExist",
       [](auto& stub, auto* context, const std::string&) {
         v1::BatchExistRequest request;
         v1::BatchExistResponse response;
         return stub.BatchExist(context, request, &response);
       }},
      {"BatchRemove",
       [](auto& stub, auto* context, const std::string&) {
         v1::BatchRemoveRequest request;
         v1::BatchRemoveResponse response;
         return stub.BatchRemove(context, request, &response);
       }},
      {"BatchDropReplicas",
       [](auto& stub, auto* context, const std::string&) {
         v1::BatchDropReplicasRequest request;
         request.set_segment("no-segment-is-named-this");
         v1::BatchDropReplicasResponse response;
         return stub.BatchDropReplicas(context, request, &response);
       }},
      {"ReplicaCopyStart",
       [](auto& stub, auto* context, const std::string&) {
         v1::ReplicaCopyStartRequest request;
         request.set_key("no-key-is-named-this");
         request.add_targets("no-segment-is-named-this");
         request.set_dry_run(true);
         v1::ReplicaCopyStartResponse response;
         return stub.ReplicaCopyStart(context, request, &response);
       }},
      {"ReplicaCopyEnd",
       [](auto& stub, auto* context, const std::string&) {
         v1::MigrateEndRequest request;
         v1::MigrateEndResponse response;
         return stub.ReplicaCopyEnd(context, request, &response);
       }},
      {"RemoveAll",
       [](auto& stub, auto* context, const std::string&) {
         v1::RemoveAllRequest request;
         request.set_key_regex("^no-key-is-named-this$");
         v1::RemoveAllResponse response;
         return stub.RemoveAll(context, request, &response);
       }},
      {"DrainSegment",
       [](auto& stub, auto* context, const std::string&) {
         v1::DrainSegmentRequest request;
         request.set_name("no-such-segment");
         v1::DrainSegmentResponse response;
         return stub.DrainSegment(context, request, &response);
       }},
      {"MigrateStart",
       [](auto& stub, auto* context, const std::string&) {
         v1::MigrateStartRequest request;
         request.set_segment("no-such-segment");
         v1::MigrateStartResponse response;
         return stub.MigrateStart(context, request, &response);
       }},
      {"MigrateEnd",
       [](auto& stub, auto* context, const std::string&) {
         v1::MigrateEndRequest request;
         v1::MigrateEndResponse response;
         return stub.MigrateEnd(context, request, &response);
       }},
      {"GetClusterStatus",
       [](auto& stub, auto* context, const std::string&) {
         v1::GetClusterStatusRequest request;
         v1::GetClusterStatusResponse response;
         return stub.GetClusterStatus(context, request, &response);
       }},
      {"ListSegments",
       [](auto& stub, auto* context, const std::string&) {
         v1::ListSegmentsRequest request;
         v1::ListSegmentsResponse response;
         return stub.ListSegments(context, request, &response);
       }},
  };
  return *calls;
}

bool Refused(const grpc::Status& status) {
  return status.error_code() == grpc::StatusCode::PERMISSION_DENIED ||
         status.error_code() == grpc::StatusCode::UNAUTHENTICATED;
}

// A pool whose master requires authentication (tokens over loopback plaintext), with one
// segment process "seg-1" holding a committed object.
class AuthTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = TestDir();
    tokens_ = WriteFile(dir_ + "/tokens", TokenRules());
    absl::StatusOr<MasterProcess> master =
        testing::StartMaster({"--embedded-segment-size=0", "--auth-tokens=" + tokens_});
    ASSERT_TRUE(master.ok()) << master.status();
    master_ = std::move(*master);
    absl::StatusOr<SegmentProcess> segment = testing::StartSegment(
        master_.grpc, "16MiB",
        {"--name=seg-1", "--auth-token-file=" + WriteFile(dir_ + "/seg-1.token", kSegment1)});
    ASSERT_TRUE(segment.ok()) << segment.status();
    segment_ = std::move(*segment);
    engine_a_ = ClientWith(kEngineA);
    ASSERT_NE(engine_a_, nullptr);
    ASSERT_TRUE(engine_a_->Put("canary", "still here").ok());
    stub_ = v1::MasterService::NewStub(MakeMasterChannel(master_.grpc));
  }

  void TearDown() override {
    if (engine_a_ == nullptr) return;
    // Whatever the attacker did, the pool keeps the object and serves it, from seg-1.
    EXPECT_EQ(engine_a_->Get("canary").value_or("<lost>"), "still here");
    absl::Status after = engine_a_->Put("after", "ok");
    EXPECT_TRUE(after.ok()) << after;
    EXPECT_EQ(engine_a_->Get("after").value_or("<lost>"), "ok");
    absl::StatusOr<ClusterStatus> status = engine_a_->GetClusterStatus();
    ASSERT_TRUE(status.ok()) << status.status();
    ASSERT_EQ(status->segments.size(), 1u);
    EXPECT_EQ(status->segments[0].name, "seg-1");
    EXPECT_EQ(status->segments[0].endpoint, segment_.data);
  }

  std::unique_ptr<Client> ClientWith(const std::string& token) {
    ClientOptions options;
    options.master_address = master_.grpc;
    options.transport = TransportKind::kTcp;
    options.cache_locations = false;
    options.auth_token = token;
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Create(options);
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? std::move(*client) : nullptr;
  }

  // One call with `token` (empty: none) on the raw stub.
  template <typename F>
  grpc::Status As(const std::string& token, F&& call) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    AttachToken(context, token);
    return call(&context);
  }

  uint64_t MasterMetric(const std::string& name_and_labels) {
    absl::StatusOr<std::string> text = testing::HttpGet(master_.http, "/metrics");
    if (!text.ok()) return 0;
    std::string line = "\n" + name_and_labels + " ";
    size_t at = text->find(line);
    if (at == std::string::npos) return 0;
    return static_cast<uint64_t>(std::stod(text->substr(at + line.size())));
  }

  std::string dir_;
  std::string tokens_;
  MasterProcess master_;
  SegmentProcess segment_;
  std::unique_ptr<Client> engine_a_;
  std::unique_ptr<v1::MasterService::Stub> stub_;
};

TEST_F(AuthTest, EveryRoleAgainstEveryRpc) {
  // engine, segment, admin, reader; A allowed, O only under its own name, - refused.
  const std::map<std::string, std::string> expected = {
      {"MountSegment", "-O--"},   {"RestoreManifest", "-O--"}, {"UnmountSegment", "-OA-"},
      {"Heartbeat", "-O--"},      {"BatchPutStart", "A-A-"},   {"BatchPutEnd", "A-A-"},
      {"BatchPutRevoke", "A-A-"}, {"BatchGetReplicaList", "A-A-"}, {"BatchExist", "A-A-"},
      {"BatchRemove", "A-A-"},    {"BatchDropReplicas", "A-A-"},   {"RemoveAll", "--A-"},
      {"DrainSegment", "--A-"},
      {"MigrateStart", "--A-"},   {"MigrateEnd", "--A-"},      {"GetClusterStatus", "AAAA"},
      {"ReplicaCopyStart", "A-A-"}, {"ReplicaCopyEnd", "A-A-"}, {"ListSegments", "AAAA"},
  };
  const google::protobuf::ServiceDescriptor* service =
      v1::MountSegmentRequest::descriptor()->file()->FindServiceByName("MasterService");
  ASSERT_EQ(static_cast<size_t>(service->method_count()), AllRpcs().size())
      << "a new RPC needs its probe here and its rule in server/master/auth_policy.cc";
  const std::string tokens[] = {kEngineA, kSegmentIdle, kAdmin, kReader};
  for (const auto& [rpc, call] : AllRpcs()) {
    ASSERT_TRUE(expected.contains(rpc)) << rpc;
    // Nobody without credentials, or with a token the master does not know.
    for (const std::string& stranger : {std::string(), std::string("guessed-token-000000000")}) {
      grpc::Status status = As(stranger, [&](auto* c) { return call(*stub_, c, "seg-idle"); });
      EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED)
          << rpc << " without a valid token: " << status.error_message();
      EXPECT_NE(status.error_message().find(rpc), std::string::npos) << status.error_message();
    }
    for (int role = 0; role < 4; ++role) {
      char rule = expected.at(rpc)[role];
      grpc::Status own = As(tokens[role], [&](auto* c) { return call(*stub_, c, "seg-idle"); });
      EXPECT_EQ(Refused(own), rule == '-')
          << rpc << " as role #" << role << ": " << own.error_code() << " " << own.error_message();
      if (rule == '-') {
        EXPECT_EQ(own.error_code(), grpc::StatusCode::PERMISSION_DENIED) << rpc;
      }
      if (rule == 'O') {
        // The same segment identity under the live segment's name.
        grpc::Status other = As(tokens[role], [&](auto* c) { return call(*stub_, c, "seg-1"); });
        EXPECT_EQ(other.error_code(), grpc::StatusCode::PERMISSION_DENIED)
            << rpc << " as seg-idle for seg-1: " << other.error_message();
      }
    }
  }
  // Refusals are counted per method and reason.
  const std::string refusals = kGrpcRefusals;
  EXPECT_GE(MasterMetric(refusals + "method=\"RemoveAll\",reason=\"no_credentials\"}"), 1u);
  EXPECT_GE(MasterMetric(refusals + "method=\"RemoveAll\",reason=\"wrong_role\"}"), 3u);
  EXPECT_GE(
      MasterMetric(std::string(kGrpcRefusals) + "method=\"Heartbeat\",reason=\"other_segment\"}"),
      1u);
  EXPECT_GE(MasterMetric("kvpool_tenant_calls_total{tenant=\"team-a\"}"), 1u);
}

TEST_F(AuthTest, StrangersRemoveAllForceRemovesNothing) {
  for (const std::string& attacker : {std::string(), std::string(kEngineB), std::string(kReader)}) {
    grpc::Status status = As(attacker, [&](auto* c) {
      v1::RemoveAllRequest request;
      request.set_force(true);
      v1::RemoveAllResponse response;
      return stub_->RemoveAll(c, request, &response);
    });
    EXPECT_TRUE(Refused(status)) << status.error_message();
  }
  // TearDown reads the canary back.
}

TEST_F(AuthTest, StrangersDrainSegmentLeavesItServing) {
  for (const std::string& attacker : {std::string(), std::string(kEngineA), std::string(kSegment2)}) {
    grpc::Status status = As(attacker, [&](auto* c) {
      v1::DrainSegmentRequest request;
      request.set_name("seg-1");
      v1::DrainSegmentResponse response;
      return stub_->DrainSegment(c, request, &response);
    });
    EXPECT_TRUE(Refused(status)) << status.error_message();
  }
  // Had it drained, the segment would exit within a heartbeat or two.
  EXPECT_FALSE(segment_.process->WaitForLine("kvpool-segment drained", absl::Seconds(3)).ok());
  EXPECT_EQ(engine_a_->GetClusterStatus()->segments.at(0).state, "active");
}

TEST_F(AuthTest, FakeAndHijackingMountsAreRefused) {
  auto mount = [&](const std::string& token, const std::string& name, uint64_t size) {
    return As(token, [&](auto* c) {
      v1::MountSegmentRequest request;
      request.set_name(name);
      request.set_host("attacker");
      request.set_endpoint("127.0.0.1:9");  // where the attacker would serve forged bytes
      request.set_size(size);
      request.set_incarnation(777);
      request.set_token_secret(std::string(32, 'x'));
      v1::MountSegmentResponse response;
      return stub_->MountSegment(c, request, &response);
    });
  };
  // A fake 1 TiB segment that would capture every later write; the live segment's name,
  // which would redirect its endpoint: by a stranger, by an engine, by another segment.
  EXPECT_EQ(mount("", "fake", 1ull << 40).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(mount(kEngineA, "fake", 1ull << 40).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(mount("", "seg-1", 1ull << 40).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(mount(kSegment2, "seg-1", 1ull << 40).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  // Later writes still land on seg-1 and read back as written (TearDown checks the endpoint).
  ASSERT_TRUE(engine_a_->Put("after-mounts", "genuine").ok());
  EXPECT_EQ(engine_a_->Get("after-mounts").value_or("<lost>"), "genuine");
}

TEST_F(AuthTest, RestoreManifestAndHeartbeatsForALiveSegmentAreRefused) {
  for (const std::string& attacker : {std::string(), std::string(kSegment2), std::string(kAdmin)}) {
    grpc::Status restore = As(attacker, [&](auto* c) {
      v1::RestoreManifestRequest request;
      request.set_name("seg-1");
      request.set_incarnation(1);
      v1::ManifestRecord* record = request.add_records();
      record->set_key("canary");
      record->set_offset(0);
      record->set_size(10);
      request.set_done(true);
      v1::RestoreManifestResponse response;
      return stub_->RestoreManifest(c, request, &response);
    });
    EXPECT_TRUE(Refused(restore)) << restore.error_message();
    grpc::Status heartbeat = As(attacker, [&](auto* c) {
      v1::HeartbeatRequest request;
      request.set_name("seg-1");
      request.set_acked_seq(1ull << 40);
      v1::HeartbeatResponse response;
      return stub_->Heartbeat(c, request, &response);
    });
    EXPECT_TRUE(Refused(heartbeat)) << heartbeat.error_message();
  }
}

TEST_F(AuthTest, ASegmentWithAnotherSegmentsTokenNeverMounts) {
  // seg-2's token, under seg-1's name: the master refuses every mount it tries.
  absl::StatusOr<std::unique_ptr<testing::Process>> impostor = testing::Process::Start(
      testing::SegmentBinary(),
      {"--master=" + master_.grpc, "--size=16MiB", "--listen=127.0.0.1:0",
       "--http-listen=127.0.0.1:0", "--prefault=false", "--name=seg-1",
       "--auth-token-file=" + WriteFile(dir_ + "/seg-2.token", kSegment2)});
  ASSERT_TRUE(impostor.ok()) << impostor.status();
  EXPECT_FALSE((*impostor)->WaitForLine("kvpool-segment mounted", absl::Seconds(3)).ok());
  EXPECT_GE(MasterMetric(
                std::string(kGrpcRefusals) + "method=\"MountSegment\",reason=\"other_segment\"}"),
            1u);
}

TEST_F(AuthTest, TenantsCannotSeeReadOverwriteOrRemoveEachOthersObjects) {
  std::unique_ptr<Client> engine_b = ClientWith(kEngineB);
  ASSERT_NE(engine_b, nullptr);
  ASSERT_TRUE(engine_a_->Put("shared-name", "A's bytes").ok());
  EXPECT_FALSE(engine_b->Exists("shared-name").value_or(true));
  EXPECT_EQ(engine_b->Get("shared-name").status().code(), absl::StatusCode::kNotFound);
  // B's put of the same name is B's own object (no dedup across tenants)...
  ASSERT_TRUE(engine_b->Put("shared-name", "B's bytes").ok());
  EXPECT_EQ(engine_b->Get("shared-name").value_or(""), "B's bytes");
  EXPECT_EQ(engine_a_->Get("shared-name").value_or(""), "A's bytes");
  // ...and B's removes reach only B's.
  std::vector<std::string> keys = {"shared-name", "canary"};
  std::vector<absl::Status> removed = engine_b->BatchRemove(keys, true);
  EXPECT_TRUE(removed[0].ok()) << removed[0];
  EXPECT_EQ(removed[1].code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(engine_a_->Get("shared-name").value_or(""), "A's bytes");
  // A key that spells A's stored key is looked up in B's namespace, not A's.
  std::string forged = absl::StrCat("\x1e", "team-a", "\x1e", "shared-name");
  EXPECT_EQ(engine_b->Get(forged).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(engine_a_->Get("shared-name").value_or(""), "A's bytes");
}

// Reads by key (READ_KEY) look a key up in the caller's tenant only, under a credential the
// master gave that tenant; a stranger's frame is refused.
TEST_F(AuthTest, ReadsByKeyStayInTheCallersTenant) {
  std::unique_ptr<Client> engine_b = ClientWith(kEngineB);
  ASSERT_NE(engine_b, nullptr);
  ASSERT_TRUE(engine_a_->Put("by-key", "A's value").ok());
  auto get = [](Client& client, const std::string& key) -> absl::StatusOr<std::string> {
    std::string buffer(64, '\0');
    absl::StatusOr<uint64_t> size = client.Get(key, {MutableBuffer{buffer.data(), 64}});
    if (!size.ok()) return size.status();
    return buffer.substr(0, *size);
  };
  EXPECT_EQ(get(*engine_b, "by-key").status().code(), absl::StatusCode::kNotFound);
  std::string forged = absl::StrCat("\x1e", "team-a", "\x1e", "by-key");
  EXPECT_EQ(get(*engine_b, forged).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(get(*engine_a_, "by-key").value_or("<lost>"), "A's value");
  EXPECT_NE(engine_a_->MetricsText().find("kvpool_client_key_reads_total{result=\"hit\"} 1"),
            std::string::npos)
      << engine_a_->MetricsText();
  EXPECT_NE(engine_b->MetricsText().find("kvpool_client_key_reads_total{result=\"hit\"} 0"),
            std::string::npos)
      << engine_b->MetricsText();
  // A stranger's READ_KEY with no credential: refused, connection closed.
  int fd = testing::ConnectRawTcp(segment_.data);
  ASSERT_GE(fd, 0);
  std::string key = "by-key";
  uint8_t header[wire::kRequestHeaderSize];
  wire::EncodeRequest({.opcode = wire::Opcode::kReadKey,
                       .flags = 6,
                       .request_id = 1,
                       .offset = 1 << 20,
                       .length = 6 + key.size()},
                      header);
  std::string frame = absl::StrCat(
      absl::string_view(reinterpret_cast<const char*>(header), sizeof(header)), "team-a", key);
  ASSERT_EQ(send(fd, frame.data(), frame.size(), MSG_NOSIGNAL), static_cast<ssize_t>(frame.size()));
  uint8_t answer[wire::kResponseHeaderSize];
  ASSERT_EQ(recv(fd, answer, sizeof(answer), MSG_WAITALL), static_cast<ssize_t>(sizeof(answer)));
  EXPECT_EQ(wire::DecodeResponse(answer)->status, v1::PERMISSION_DENIED);
  close(fd);
}

TEST_F(AuthTest, KvpoolctlCarriesItsToken) {
  std::string admin_token = WriteFile(dir_ + "/admin.token", kAdmin);
  auto run = [&](const std::string& args) {
    std::string command = absl::StrCat(testing::CtlBinary(), " --master=", master_.grpc, " ",
                                       args, " 2>&1");
    FILE* pipe = popen(command.c_str(), "r");
    std::string output;
    char buffer[4096];
    while (size_t n = fread(buffer, 1, sizeof(buffer), pipe)) output.append(buffer, n);
    int status = pclose(pipe);
    return std::make_pair(WIFEXITED(status) ? WEXITSTATUS(status) : -1, output);
  };
  // A stranger (no token) is told it is not authenticated, with the master's reason, and
  // exits 3 (not INTERNAL_ERROR and 1).
  auto [denied_rc, denied] = run("status");
  EXPECT_EQ(denied_rc, 3) << denied;
  EXPECT_TRUE(absl::StrContains(denied, "(UNAUTHENTICATED)")) << denied;
  EXPECT_TRUE(absl::StrContains(denied, "authentication")) << denied;
  EXPECT_FALSE(absl::StrContains(denied, "INTERNAL_ERROR")) << denied;
  auto [json_rc, json] = run("--json status");
  EXPECT_EQ(json_rc, 3) << json;
  EXPECT_TRUE(absl::StrContains(json, "\"error\":\"UNAUTHENTICATED\"")) << json;
  auto [guess_rc, guess] =
      run("--auth-token-file=" + WriteFile(dir_ + "/guess.token", "guessed-token-0000000001") +
          " segments");
  EXPECT_EQ(guess_rc, 3) << guess;
  EXPECT_TRUE(absl::StrContains(guess, "(UNAUTHENTICATED)")) << guess;
  auto [ok_rc, ok] = run("--auth-token-file=" + admin_token + " segments");
  EXPECT_EQ(ok_rc, 0) << ok;
  EXPECT_TRUE(absl::StrContains(ok, "seg-1")) << ok;
  // A reader may look but not remove: PERMISSION_DENIED with the role in the message.
  auto [ctl_rm_rc, ctl_rm] =
      run("--auth-token-file=" + WriteFile(dir_ + "/reader.token", kReader) + " rm canary");
  EXPECT_EQ(ctl_rm_rc, 3) << ctl_rm;
  EXPECT_TRUE(absl::StrContains(ctl_rm, "(PERMISSION_DENIED)")) << ctl_rm;
  EXPECT_TRUE(absl::StrContains(ctl_rm, "reader")) << ctl_rm;
  EXPECT_EQ(engine_a_->Get("canary").status().code(), absl::StatusCode::kOk);
}

TEST(TenantQuotaTest, ATenantOverItsQuotaGetsNoAvailableHandleWhileOthersPut) {
  std::string dir = TestDir();
  absl::StatusOr<MasterProcess> master = testing::StartMaster(
      {"--embedded-segment-size=0", "--auth-tokens=" + WriteFile(dir + "/tokens-q", TokenRules()),
       "--tenant-quotas=team-a=96KiB"});
  ASSERT_TRUE(master.ok()) << master.status();
  absl::StatusOr<SegmentProcess> segment = testing::StartSegment(
      master->grpc, "16MiB",
      {"--name=seg-1", "--auth-token-file=" + WriteFile(dir + "/seg-1.token", kSegment1)});
  ASSERT_TRUE(segment.ok()) << segment.status();
  auto connect = [&](const char* token) {
    ClientOptions options;
    options.master_address = master->grpc;
    options.transport = TransportKind::kTcp;
    options.auth_token = token;
    return std::move(Client::Create(options).value());
  };
  std::unique_ptr<Client> a = connect(kEngineA);
  std::unique_ptr<Client> b = connect(kEngineB);
  const std::string value(64 << 10, 'a');
  ASSERT_TRUE(a->Put("first", value).ok());
  absl::Status over = a->Put("second", value);
  EXPECT_EQ(over.code(), absl::StatusCode::kResourceExhausted) << over;
  EXPECT_TRUE(absl::StrContains(over.message(), "quota")) << over;
  // The pool is far from full: tenant b puts as much as it likes.
  for (int i = 0; i < 4; ++i) {
    absl::Status put = b->Put(absl::StrCat("b-", i), value);
    EXPECT_TRUE(put.ok()) << put;
  }
  // Once a's first object goes, a has room again; nothing was lost meanwhile.
  EXPECT_EQ(a->Get("first").value_or(""), value);
  ASSERT_TRUE(a->BatchRemove(std::vector<std::string>{"first"}, true)[0].ok());
  EXPECT_TRUE(a->Put("second", value).ok());
  absl::StatusOr<std::string> metrics = testing::HttpGet(master->http, "/metrics");
  ASSERT_TRUE(metrics.ok());
  EXPECT_TRUE(absl::StrContains(*metrics, "kvpool_tenant_used_bytes{tenant=\"team-a\"} 65536"))
      << *metrics;
  EXPECT_TRUE(absl::StrContains(*metrics, "kvpool_tenant_quota_bytes{tenant=\"team-a\"} 98304"))
      << *metrics;
}

// --- TLS ---

class TlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = TestDir();
    absl::StatusOr<testing::TestCa> pool = testing::TestCa::Create(dir_, "pool");
    ASSERT_TRUE(pool.ok()) << pool.status();
    pool_ca_ = *pool;
    absl::StatusOr<testing::TestCa> rogue = testing::TestCa::Create(dir_, "rogue");
    ASSERT_TRUE(rogue.ok()) << rogue.status();
    rogue_ca_ = *rogue;
    absl::StatusOr<testing::CertFiles> server = pool_ca_.Issue("master");
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *server;
    tokens_ = WriteFile(dir_ + "/tokens", TokenRules());
  }

  void StartPool(std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {"--embedded-segment-size=0", "--auth-tokens=" + tokens_,
                                     "--tls-cert=" + server_.cert, "--tls-key=" + server_.key,
                                     "--tls-client-ca=" + pool_ca_.ca_file(),
                                     "--tls-reload-interval=1s"};
    args.insert(args.end(), extra.begin(), extra.end());
    absl::StatusOr<MasterProcess> master = testing::StartMaster(args);
    ASSERT_TRUE(master.ok()) << master.status();
    master_ = std::move(*master);
    absl::StatusOr<testing::CertFiles> seg = pool_ca_.Issue("seg-tls");
    ASSERT_TRUE(seg.ok()) << seg.status();
    // The segment's identity is its certificate (mutual TLS), no token.
    absl::StatusOr<SegmentProcess> segment = testing::StartSegment(
        master_.grpc, "16MiB",
        {"--name=seg-tls", "--tls-ca=" + pool_ca_.ca_file(), "--tls-cert=" + seg->cert,
         "--tls-key=" + seg->key});
    ASSERT_TRUE(segment.ok()) << segment.status();
    segment_ = std::move(*segment);
  }

  absl::StatusOr<std::unique_ptr<Client>> Connect(const std::string& ca,
                                                  const testing::CertFiles& cert = {},
                                                  const std::string& token = "") {
    ClientOptions options;
    options.master_address = master_.grpc;
    options.transport = TransportKind::kTcp;
    options.connect_timeout = absl::Seconds(3);
    options.tls_ca_file = ca;
    options.tls_cert_file = cert.cert;
    options.tls_key_file = cert.key;
    options.auth_token = token;
    return Client::Create(options);
  }

  std::string dir_;
  testing::TestCa pool_ca_;
  testing::TestCa rogue_ca_;
  testing::CertFiles server_;
  std::string tokens_;
  MasterProcess master_;
  SegmentProcess segment_;
};

TEST_F(TlsTest, OnlyTrustedCallersWithValidCredentialsGetIn) {
  StartPool();
  // A stranger speaking plaintext.
  absl::StatusOr<std::unique_ptr<Client>> plain = Connect("");
  EXPECT_FALSE(plain.ok());
  // A client that trusts another CA does not accept the master (nor send its token to it).
  EXPECT_FALSE(Connect(rogue_ca_.ca_file(), {}, kEngineA).ok());
  // An expired client certificate of the right CA, and a client certificate of another CA,
  // fail the handshake.
  absl::StatusOr<testing::CertFiles> expired = pool_ca_.Issue("engine-c", -1);
  ASSERT_TRUE(expired.ok());
  EXPECT_FALSE(Connect(pool_ca_.ca_file(), *expired).ok());
  absl::StatusOr<testing::CertFiles> forged = rogue_ca_.Issue("engine-c");
  ASSERT_TRUE(forged.ok());
  EXPECT_FALSE(Connect(pool_ca_.ca_file(), *forged).ok());
  // TLS without any identity: the handshake passes, the calls do not.
  absl::StatusOr<std::unique_ptr<Client>> anonymous = Connect(pool_ca_.ca_file());
  ASSERT_FALSE(anonymous.ok());
  EXPECT_EQ(anonymous.status().code(), absl::StatusCode::kUnauthenticated) << anonymous.status();
  // A valid certificate nobody gave a rule.
  absl::StatusOr<testing::CertFiles> nobody = pool_ca_.Issue("nobody");
  ASSERT_TRUE(nobody.ok());
  absl::StatusOr<std::unique_ptr<Client>> unknown = Connect(pool_ca_.ca_file(), *nobody);
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kUnauthenticated) << unknown.status();

  // The certificate's name is the identity: engine-c of tenant team-c. A token over TLS is
  // engine-a of team-a. Each sees only its own tenant's objects.
  absl::StatusOr<testing::CertFiles> engine_c_cert = pool_ca_.Issue("engine-c");
  ASSERT_TRUE(engine_c_cert.ok());
  absl::StatusOr<std::unique_ptr<Client>> engine_c = Connect(pool_ca_.ca_file(), *engine_c_cert);
  ASSERT_TRUE(engine_c.ok()) << engine_c.status();
  absl::StatusOr<std::unique_ptr<Client>> engine_a = Connect(pool_ca_.ca_file(), {}, kEngineA);
  ASSERT_TRUE(engine_a.ok()) << engine_a.status();
  ASSERT_TRUE((*engine_c)->Put("k", "from c, over mutual TLS").ok());
  EXPECT_EQ((*engine_c)->Get("k").value_or(""), "from c, over mutual TLS");
  EXPECT_EQ((*engine_a)->Get("k").status().code(), absl::StatusCode::kNotFound);
  absl::StatusOr<ClusterStatus> status = (*engine_a)->GetClusterStatus();
  ASSERT_TRUE(status.ok());
  ASSERT_EQ(status->segments.size(), 1u);
  EXPECT_EQ(status->segments[0].name, "seg-tls");
}

TEST_F(TlsTest, ARotatedServerCertificateIsServedWithoutARestart) {
  StartPool();
  ASSERT_TRUE(Connect(pool_ca_.ca_file(), {}, kEngineA).ok());
  // Replace the master's key and certificate with ones of a new CA (rename into place, key
  // and certificate together).
  absl::StatusOr<testing::TestCa> next = testing::TestCa::Create(dir_, "next");
  ASSERT_TRUE(next.ok());
  absl::StatusOr<testing::CertFiles> rotated = next->Issue("master-2");
  ASSERT_TRUE(rotated.ok());
  ASSERT_EQ(rename(rotated->key.c_str(), server_.key.c_str()), 0);
  ASSERT_EQ(rename(rotated->cert.c_str(), server_.cert.c_str()), 0);
  EXPECT_TRUE(Eventually([&] { return Connect(next->ca_file(), {}, kEngineA).ok(); },
                         absl::Seconds(20)));
  EXPECT_FALSE(Connect(pool_ca_.ca_file(), {}, kEngineA).ok());
}

TEST_F(TlsTest, BadTlsFilesAreAClearErrorAtStart) {
  absl::StatusOr<MasterProcess> mismatched = testing::StartMaster(
      {"--tls-cert=" + server_.cert, "--tls-key=" + pool_ca_.ca_file()});
  EXPECT_FALSE(mismatched.ok());
  ClientOptions options;
  options.tls_ca_file = dir_ + "/missing.pem";
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Create(options);
  ASSERT_FALSE(client.ok());
  EXPECT_EQ(client.status().code(), absl::StatusCode::kInvalidArgument) << client.status();
  EXPECT_TRUE(absl::StrContains(client.status().message(), "missing.pem")) << client.status();
}

// --- Safe defaults ---

// Runs `binary args` to its exit or its readiness line, with stderr merged into stdout.
struct RunResult {
  int exit_code = -1;
  std::string output;
};

RunResult RunToExit(const std::string& binary, const std::string& args) {
  std::string command = absl::StrCat(binary, " ", args, " 2>&1");
  FILE* pipe = popen(command.c_str(), "r");
  RunResult run;
  char buffer[4096];
  while (size_t n = fread(buffer, 1, sizeof(buffer), pipe)) run.output.append(buffer, n);
  int status = pclose(pipe);
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return run;
}

TEST(SafeDefaultsTest, ANonLoopbackBindNeedsTlsAndAuthOrInsecure) {
  RunResult master = RunToExit(testing::MasterBinary(),
                         "--listen=0.0.0.0:0 --http-listen=127.0.0.1:0 --embedded-segment-size=0");
  EXPECT_EQ(master.exit_code, 2) << master.output;
  EXPECT_TRUE(absl::StrContains(master.output, "--listen=0.0.0.0:0 is not a loopback address"))
      << master.output;
  EXPECT_TRUE(absl::StrContains(master.output, "--insecure")) << master.output;
  RunResult segment = RunToExit(testing::SegmentBinary(),
                          "--master=127.0.0.1:1 --size=4MiB --listen=0.0.0.0:0 "
                          "--http-listen=127.0.0.1:0 --prefault=false");
  EXPECT_EQ(segment.exit_code, 2) << segment.output;
  EXPECT_TRUE(absl::StrContains(segment.output, "--insecure")) << segment.output;

  // --insecure starts, with a warning.
  absl::StatusOr<std::unique_ptr<testing::Process>> insecure = testing::Process::Start(
      "/bin/sh", {"-c", absl::StrCat("exec ", testing::MasterBinary(),
                                     " --listen=0.0.0.0:0 --http-listen=127.0.0.1:0 "
                                     "--embedded-segment-size=0 --insecure 2>&1")});
  ASSERT_TRUE(insecure.ok());
  absl::StatusOr<std::string> warning = (*insecure)->WaitForLine("W", absl::Seconds(30));
  ASSERT_TRUE(warning.ok()) << warning.status();
  EXPECT_TRUE(absl::StrContains(*warning, "--insecure: reachable at --listen=0.0.0.0:0"))
      << *warning;
  EXPECT_TRUE(absl::StrContains(*warning, "without TLS (--tls-cert/--tls-key) and authentication"))
      << *warning;
  EXPECT_TRUE((*insecure)->WaitForLine("kvpool-master listening", absl::Seconds(30)).ok());
}

// The HTTP pages beyond loopback: a raw HTTP client without a token, with an unknown one, with
// an engine's, and with a reader's and an admin's; the probes' pages stay open.
TEST(HttpAuthTest, PagesBeyondLoopbackNeedAReaderOrAdminToken) {
  std::string dir = TestDir();
  std::string tokens = WriteFile(dir + "/tokens-http", TokenRules());
  absl::StatusOr<MasterProcess> master = testing::StartMaster(
      {"--embedded-segment-size=0", "--auth-tokens=" + tokens, "--http-listen=0.0.0.0:0",
       "--insecure"});
  ASSERT_TRUE(master.ok()) << master.status();
  std::string http = absl::StrCat("127.0.0.1:", ParseHostPort(master->http)->port);
  auto fetch = [&](const std::string& address, const std::string& path,
                   const std::string& token) {
    absl::StatusOr<testing::HttpReply> reply = testing::HttpFetch(
        address, path, token.empty() ? "" : absl::StrCat("Authorization: Bearer ", token, "\r\n"));
    EXPECT_TRUE(reply.ok()) << reply.status();
    return reply.ok() ? *reply : testing::HttpReply{};
  };
  for (const char* path : {"/metrics", "/get_all_segments"}) {
    EXPECT_EQ(fetch(http, path, "").status, 401) << path;
    EXPECT_EQ(fetch(http, path, "guessed-token-0000000001").status, 401) << path;
    testing::HttpReply engine = fetch(http, path, kEngineA);
    EXPECT_EQ(engine.status, 403) << path;
    EXPECT_TRUE(absl::StrContains(engine.body, "role engine")) << engine.body;
    EXPECT_EQ(fetch(http, path, kReader).status, 200) << path;
    EXPECT_EQ(fetch(http, path, kAdmin).status, 200) << path;
  }
  // Each refused page is counted, by reason; the probes' open pages and admitted ones not.
  auto sample = [&](const std::string& address, const std::string& token,
                    const std::string& name) -> double {
    std::string body = fetch(address, "/metrics", token).body;
    for (absl::string_view line : absl::StrSplit(body, '\n')) {
      if (absl::StartsWith(line, name + " ")) {
        double value = -1;
        if (absl::SimpleAtod(line.substr(name.size() + 1), &value)) return value;
      }
    }
    return -1;
  };
  const std::string http_refusals = "kvpool_auth_refusals_total{surface=\"http\",method=\"GET\",";
  EXPECT_EQ(sample(http, kReader, http_refusals + "reason=\"no_credentials\"}"), 2);
  EXPECT_EQ(sample(http, kAdmin, http_refusals + "reason=\"unknown_token\"}"), 2);
  EXPECT_EQ(sample(http, kReader, http_refusals + "reason=\"wrong_role\"}"), 2);
  EXPECT_TRUE(absl::StrContains(fetch(http, "/metrics", kReader).body, "kvpool_auth_rules"));
  EXPECT_FALSE(absl::StrContains(fetch(http, "/metrics", "").body, "kvpool_"));
  EXPECT_EQ(fetch(http, "/healthz", "").status, 200);
  EXPECT_EQ(fetch(http, "/readyz", "").status, 200);

  // A segment with --http-token-file: its /metrics only with that token.
  std::string reader_file = WriteFile(dir + "/reader.token", kReader);
  absl::StatusOr<SegmentProcess> segment = testing::StartSegment(
      master->grpc, "16MiB",
      {"--name=seg-1", "--auth-token-file=" + WriteFile(dir + "/seg-1-http.token", kSegment1),
       "--http-token-file=" + reader_file});
  ASSERT_TRUE(segment.ok()) << segment.status();
  EXPECT_EQ(fetch(segment->http, "/metrics", "").status, 401);
  EXPECT_EQ(fetch(segment->http, "/metrics", kAdmin).status, 401);
  testing::HttpReply scraped = fetch(segment->http, "/metrics", kReader);
  EXPECT_EQ(scraped.status, 200);
  EXPECT_EQ(sample(segment->http, kReader, http_refusals + "reason=\"no_credentials\"}"), 1);
  EXPECT_EQ(sample(segment->http, kReader, http_refusals + "reason=\"unknown_token\"}"), 1);
  EXPECT_TRUE(absl::StrContains(scraped.body, "kvpool_segment_")) << scraped.body.substr(0, 200);
  EXPECT_EQ(fetch(segment->http, "/healthz", "").status, 200);
}

TEST(SafeDefaultsTest, TheDefaultPoolIsLoopbackOnlyAndSaysSo) {
  absl::StatusOr<std::unique_ptr<testing::Process>> master = testing::Process::Start(
      "/bin/sh", {"-c", absl::StrCat("exec ", testing::MasterBinary(),
                                     " --listen=127.0.0.1:0 --http-listen=127.0.0.1:0 "
                                     "--embedded-segment-size=4MiB --prefault=false 2>&1")});
  ASSERT_TRUE(master.ok());
  bool said = false;
  for (int i = 0; i < 20 && !said; ++i) {
    absl::StatusOr<std::string> line = (*master)->WaitForLine("I", absl::Seconds(30));
    ASSERT_TRUE(line.ok()) << line.status();
    said = absl::StrContains(
        *line, "addresses: loopback only, without TLS, without authentication");
  }
  EXPECT_TRUE(said);
  absl::StatusOr<std::string> ready = (*master)->WaitForLine("kvpool-master", absl::Seconds(30));
  ASSERT_TRUE(ready.ok());
  EXPECT_TRUE(absl::StrContains(*ready, "tls=off auth=off")) << *ready;
}

}  // namespace
}  // namespace kvpool
