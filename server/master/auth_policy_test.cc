// The authorization table, the credentials file and tenants' namespaces, without sockets.

#include "server/master/auth_policy.h"

#include <fstream>
#include <map>
#include <string>

#include "gtest/gtest.h"
#include "kvpool/v1/master.grpc.pb.h"
#include "server/master/authenticator.h"
#include "server/master/credential_table.h"
#include "server/master/tenant_keys.h"

namespace kvpool::master {
namespace {

constexpr Role kRoles[] = {Role::kEngine, Role::kSegment, Role::kAdmin, Role::kReader};

// The policy as the issue states it, one row per RPC of MasterService; columns engine,
// segment, admin, reader. A: allowed, O: only under the caller's own segment name, -: denied.
const std::map<std::string, std::string>& ExpectedTable() {
  static const auto* table = new std::map<std::string, std::string>{
      {"MountSegment", "-O--"},        {"RestoreManifest", "-O--"},
      {"UnmountSegment", "-OA-"},      {"Heartbeat", "-O--"},
      {"BatchPutStart", "A-A-"},       {"BatchPutEnd", "A-A-"},
      {"BatchPutRevoke", "A-A-"},      {"BatchGetReplicaList", "A-A-"},
      {"BatchExist", "A-A-"},          {"BatchRemove", "A-A-"},
      {"BatchDropReplicas", "A-A-"},
      {"ReplicaCopyStart", "A-A-"},    {"ReplicaCopyEnd", "A-A-"},
      {"RemoveAll", "--A-"},           {"DrainSegment", "--A-"},
      {"MigrateStart", "--A-"},        {"MigrateEnd", "--A-"},
      {"GetClusterStatus", "AAAA"},    {"ListSegments", "AAAA"},
  };
  return *table;
}

std::optional<Rpc> RpcNamed(const std::string& name) {
  for (int i = 0; i < static_cast<int>(Rpc::kCount); ++i) {
    if (name == RpcName(static_cast<Rpc>(i))) return static_cast<Rpc>(i);
  }
  return std::nullopt;
}

char Letter(Rule rule) {
  return rule == Rule::kAllow ? 'A' : rule == Rule::kOwnSegmentOnly ? 'O' : '-';
}

TEST(AuthPolicyTest, EveryMethodOfTheServiceHasARuleForEveryRole) {
  const google::protobuf::ServiceDescriptor* service =
      v1::MountSegmentRequest::descriptor()->file()->FindServiceByName("MasterService");
  ASSERT_NE(service, nullptr);
  EXPECT_EQ(service->method_count(), static_cast<int>(Rpc::kCount));
  for (int m = 0; m < service->method_count(); ++m) {
    const std::string& name = service->method(m)->name();
    std::optional<Rpc> rpc = RpcNamed(name);
    ASSERT_TRUE(rpc.has_value()) << name << " has no Rpc value (master_metrics.h) and no rule";
    auto expected = ExpectedTable().find(name);
    ASSERT_NE(expected, ExpectedTable().end())
        << name << ": add its row to auth_policy.cc and to this test's table";
    std::string actual;
    for (Role role : kRoles) actual += Letter(RuleFor(*rpc, role));
    EXPECT_EQ(actual, expected->second) << name << " (engine, segment, admin, reader)";
  }
}

TEST(AuthPolicyTest, AuthorizeAllowsAndRefusesEveryRoleOnEveryRpc) {
  for (const auto& [name, letters] : ExpectedTable()) {
    Rpc rpc = *RpcNamed(name);
    for (int r = 0; r < 4; ++r) {
      Identity caller{.name = "seg-1", .role = kRoles[r], .tenant = ""};
      Refusal why = Refusal::kCount;
      absl::Status own = Authorize(rpc, caller, "seg-1", &why);
      absl::Status other = Authorize(rpc, caller, "seg-2", &why);
      switch (letters[r]) {
        case 'A':
          EXPECT_TRUE(own.ok()) << name << " " << RoleName(kRoles[r]) << own;
          EXPECT_TRUE(other.ok()) << name << " " << RoleName(kRoles[r]) << other;
          break;
        case 'O':
          EXPECT_TRUE(own.ok()) << name << " " << own;
          EXPECT_EQ(other.code(), absl::StatusCode::kPermissionDenied) << name;
          EXPECT_EQ(why, Refusal::kOtherSegment);
          EXPECT_NE(other.message().find("seg-2"), std::string::npos) << other;
          break;
        default:
          EXPECT_EQ(own.code(), absl::StatusCode::kPermissionDenied) << name;
          EXPECT_EQ(why, Refusal::kWrongRole);
          EXPECT_NE(own.message().find(RoleName(kRoles[r])), std::string::npos) << own;
          EXPECT_NE(own.message().find(name), std::string::npos) << own;
      }
    }
  }
}

constexpr char kRules[] = R"(
# engines of two teams, a segment, an admin and a reader
token engine-a-secret-0001 engine-a engine team-a
token engine-b-secret-0002 engine-b engine team-b
token segment-1-secret-003 seg-1    segment
token admin-secret-0000004 ops      admin -
token reader-secret-000005 grafana  reader
cert  seg-2.pool.internal  segment
cert  engine-c             engine team-c   # by certificate
)";

TEST(AuthPolicyTest, APrefixIdentityActsOnlyUnderNamesWithThatPrefix) {
  Identity shared{.name = "node-*", .role = Role::kSegment};
  EXPECT_TRUE(Authorize(Rpc::kMountSegment, shared, "node-a").ok());
  EXPECT_TRUE(Authorize(Rpc::kHeartbeat, shared, "node-b7").ok());
  Refusal why = Refusal::kNone;
  EXPECT_EQ(Authorize(Rpc::kMountSegment, shared, "node-", &why).code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(why, Refusal::kOtherSegment);
  EXPECT_EQ(Authorize(Rpc::kRestoreManifest, shared, "gpu-node-a").code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(Authorize(Rpc::kRemoveAll, shared, "").code(), absl::StatusCode::kPermissionDenied);
  Identity any{.name = "*", .role = Role::kSegment};
  EXPECT_TRUE(Authorize(Rpc::kMountSegment, any, "x").ok());
  EXPECT_FALSE(Authorize(Rpc::kMountSegment, any, "").ok());
  // Without a '*' the name must be exact.
  EXPECT_FALSE(SegmentNameMatches("node-a", "node-ab"));
  EXPECT_TRUE(SegmentNameMatches("node-a", "node-a"));
  // A '*' parses only at the end of a segment token rule.
  absl::StatusOr<CredentialTable> table =
      CredentialTable::Parse("token 0123456789abcdef node-* segment\n");
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_EQ(table->ForToken("0123456789abcdef")->name, "node-*");
}

TEST(CredentialTableTest, ParsesTokensAndCertificateRules) {
  absl::StatusOr<CredentialTable> table = CredentialTable::Parse(kRules);
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_EQ(table->size(), 7u);
  std::optional<Identity> a = table->ForToken("engine-a-secret-0001");
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->name, "engine-a");
  EXPECT_EQ(a->role, Role::kEngine);
  EXPECT_EQ(a->tenant, "team-a");
  EXPECT_EQ(table->ForToken("admin-secret-0000004")->tenant, "");
  EXPECT_FALSE(table->ForToken("engine-a-secret-000").has_value());
  EXPECT_FALSE(table->ForToken("").has_value());
  std::optional<Identity> c = table->ForCertificate({"unknown", "engine-c"});
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->tenant, "team-c");
  EXPECT_EQ(table->ForCertificate({"seg-2.pool.internal"})->role, Role::kSegment);
}

TEST(CredentialTableTest, RefusesBadFilesNamingTheLine) {
  struct Case {
    const char* text;
    const char* says;
  };
  for (const Case& c : {
           Case{"token short x engine", "shorter than 16"},
           Case{"token 0123456789abcdef x boss", "unknown role"},
           Case{"token 0123456789abcdef x engine bad/tenant", "tenant"},
           Case{"token 0123456789abcdef x\n", "expected: token"},
           Case{"token 0123456789abcdef x engine\ntoken 0123456789abcdef y engine",
                "already in use"},
           Case{"cert a engine\ncert a admin", "has a rule already"},
           Case{"user x engine", "starts with"},
           Case{"token 0123456789abcdef node-* engine", "may only end"},
           Case{"token 0123456789abcdef no*de segment", "may only end"},
           Case{"cert node-* segment", "may only end"},
       }) {
    absl::StatusOr<CredentialTable> table = CredentialTable::Parse(c.text);
    ASSERT_FALSE(table.ok()) << c.text;
    EXPECT_EQ(table.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(table.status().message().find(c.says), std::string::npos) << table.status();
    EXPECT_NE(table.status().message().find("line "), std::string::npos) << table.status();
  }
  EXPECT_EQ(CredentialTable::Load("/nonexistent/kvpool-tokens").status().code(),
            absl::StatusCode::kNotFound);
}

TEST(CredentialTableTest, IdentifiesACallOrSaysWhyNot) {
  CredentialTable table = *CredentialTable::Parse(kRules);
  Refusal why = Refusal::kNone;
  EXPECT_EQ(table.Identify({}, &why).status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(why, Refusal::kNoCredentials);
  EXPECT_EQ(table.Identify({.token = "guess-guess-guess-1"}, &why).status().code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(why, Refusal::kUnknownToken);
  EXPECT_EQ(table.Identify({.certificate_names = {"stranger"}}, &why).status().code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(why, Refusal::kUnknownCertificate);
  // A certificate with a rule wins over a token.
  absl::StatusOr<Identity> both = table.Identify(
      {.token = "admin-secret-0000004", .certificate_names = {"engine-c"}}, &why);
  ASSERT_TRUE(both.ok());
  EXPECT_EQ(both->name, "engine-c");
}

TEST(TenantKeysTest, TenantsLiveInSeparateNamespaces) {
  Identity a{.name = "engine-a", .role = Role::kEngine, .tenant = "team-a"};
  Identity b{.name = "engine-b", .role = Role::kEngine, .tenant = "team-b"};
  std::vector<std::string> keys_a = {"k", "model@tp_rank:0@hash"};
  std::vector<std::string> keys_b = {"k", "model@tp_rank:0@hash"};
  ASSERT_TRUE(ScopeKeys(a, keys_a).ok());
  ASSERT_TRUE(ScopeKeys(b, keys_b).ok());
  for (size_t i = 0; i < keys_a.size(); ++i) {
    EXPECT_NE(keys_a[i], keys_b[i]);
    EXPECT_EQ(TenantOfKey(keys_a[i]), "team-a");
    EXPECT_EQ(TenantOfKey(keys_b[i]), "team-b");
  }
  // No key tenant b can send lands in a's namespace: b's keys all carry b's prefix.
  std::vector<std::string> forged = {keys_a[0]};
  ASSERT_TRUE(ScopeKeys(b, forged).ok());
  EXPECT_EQ(TenantOfKey(forged[0]), "team-b");
  // A global-namespace engine may not send a tenant's stored key; an admin may.
  Identity global_engine{.name = "e", .role = Role::kEngine};
  std::vector<std::string> reach = {keys_a[0]};
  EXPECT_EQ(ScopeKeys(global_engine, reach).code(), absl::StatusCode::kInvalidArgument);
  Identity admin{.name = "ops", .role = Role::kAdmin};
  EXPECT_TRUE(ScopeKeys(admin, reach).ok());
  EXPECT_EQ(reach[0], keys_a[0]);
  std::vector<std::string> plain = {"k"};
  ASSERT_TRUE(ScopeKeys(global_engine, plain).ok());
  EXPECT_EQ(plain[0], "k");
  EXPECT_EQ(TenantOfKey("k"), "");
}

TEST(AuthenticatorTest, OffAdmitsEveryoneAsAnonymousAdmin) {
  Authenticator open;
  EXPECT_FALSE(open.enabled());
  absl::StatusOr<Identity> caller = open.AdmitPresented({}, Rpc::kRemoveAll, "");
  ASSERT_TRUE(caller.ok());
  EXPECT_EQ(caller->role, Role::kAdmin);
  EXPECT_EQ(caller->tenant, "");
}

TEST(AuthenticatorTest, CountsRefusalsByRpcAndReasonAndReloadsRules) {
  std::string path = ::testing::TempDir() + "/auth_policy_test_tokens";
  {
    std::ofstream out(path);
    out << kRules;
  }
  absl::StatusOr<std::unique_ptr<Authenticator>> auth = Authenticator::FromFile(path);
  ASSERT_TRUE(auth.ok()) << auth.status();
  Authenticator& a = **auth;
  EXPECT_EQ(a.AdmitPresented({}, Rpc::kRemoveAll, "").status().code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(a.AdmitPresented({.token = "engine-a-secret-0001"}, Rpc::kRemoveAll, "")
                .status()
                .code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(a.AdmitPresented({.token = "segment-1-secret-003"}, Rpc::kHeartbeat, "seg-9")
                .status()
                .code(),
            absl::StatusCode::kPermissionDenied);
  ASSERT_TRUE(a.AdmitPresented({.token = "segment-1-secret-003"}, Rpc::kHeartbeat, "seg-1").ok());
  ASSERT_TRUE(a.AdmitPresented({.token = "engine-a-secret-0001"}, Rpc::kBatchExist, "").ok());
  EXPECT_EQ(a.Refusals(Rpc::kRemoveAll, Refusal::kNoCredentials), 1u);
  EXPECT_EQ(a.Refusals(Rpc::kRemoveAll, Refusal::kWrongRole), 1u);
  EXPECT_EQ(a.Refusals(Rpc::kHeartbeat, Refusal::kOtherSegment), 1u);
  EXPECT_EQ(a.Refusals(Rpc::kBatchExist, Refusal::kWrongRole), 0u);
  EXPECT_EQ(a.TenantCalls("team-a"), 1u);

  // Rotation: the old token goes, a new one comes; a broken file keeps the rules in force.
  {
    std::ofstream out(path);
    out << "token engine-a-secret-NEW1 engine-a engine team-a\n";
  }
  ASSERT_TRUE(a.ReloadIfChanged().ok());
  EXPECT_EQ(a.AdmitPresented({.token = "engine-a-secret-0001"}, Rpc::kBatchExist, "")
                .status()
                .code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_TRUE(a.AdmitPresented({.token = "engine-a-secret-NEW1"}, Rpc::kBatchExist, "").ok());
  {
    std::ofstream out(path);
    out << "token broken\n\n\n";
  }
  EXPECT_FALSE(a.ReloadIfChanged().ok());
  EXPECT_TRUE(a.AdmitPresented({.token = "engine-a-secret-NEW1"}, Rpc::kBatchExist, "").ok());
}

}  // namespace
}  // namespace kvpool::master
