#include "server/master/authenticator.h"

#include <sys/stat.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/metric_families.h"
#include "grpc/grpc_security_constants.h"
#include "grpcpp/server_context.h"

namespace kvpool::master {
namespace {

constexpr absl::string_view kBearer = "Bearer ";

// The file's modification time and size; size -1 if it cannot be read.
auto StampOf(const std::string& path) {
  struct stat st {};
  struct Stamp {
    int64_t mtime_ns;
    int64_t size;
  };
  if (stat(path.c_str(), &st) != 0) return Stamp{0, -1};
  return Stamp{static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec,
               static_cast<int64_t>(st.st_size)};
}

}  // namespace

PresentedCredentials CredentialsOf(const grpc::ServerContextBase& context) {
  PresentedCredentials presented;
  const auto& metadata = context.client_metadata();
  if (auto it = metadata.find("authorization"); it != metadata.end()) {
    absl::string_view value(it->second.data(), it->second.size());
    // Anything but "Bearer <token>" counts as a token that matches nothing.
    presented.token = std::string(absl::StartsWith(value, kBearer) ? value.substr(kBearer.size())
                                                                   : absl::string_view());
  }
  std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  // Only a certificate the handshake verified against the client CA names anyone.
  if (auth != nullptr && auth->IsPeerAuthenticated()) {
    for (const char* property : {GRPC_X509_CN_PROPERTY_NAME, GRPC_X509_SAN_PROPERTY_NAME}) {
      for (const grpc::string_ref& name : auth->FindPropertyValues(property)) {
        presented.certificate_names.emplace_back(name.data(), name.size());
      }
    }
  }
  return presented;
}

absl::StatusOr<std::unique_ptr<Authenticator>> Authenticator::FromFile(const std::string& path) {
  auto stamp = StampOf(path);
  absl::StatusOr<CredentialTable> table = CredentialTable::Load(path);
  if (!table.ok()) return table.status();
  auto authenticator = std::make_unique<Authenticator>();
  authenticator->path_ = path;
  absl::MutexLock lock(&authenticator->mu_);
  authenticator->table_ = std::make_shared<const CredentialTable>(*std::move(table));
  authenticator->stamp_ = {stamp.mtime_ns, stamp.size};
  return authenticator;
}

absl::Status Authenticator::ReloadIfChanged() {
  if (!enabled()) return absl::OkStatus();
  auto read = StampOf(path_);
  FileStamp stamp{read.mtime_ns, read.size};
  {
    absl::MutexLock lock(&mu_);
    if (stamp == stamp_) return absl::OkStatus();
    // Tried once per change: a broken file is reported once, not every tick.
    stamp_ = stamp;
  }
  absl::StatusOr<CredentialTable> table = CredentialTable::Load(path_);
  if (!table.ok()) {
    KVPOOL_LOG(ERROR) << "credentials file changed but is not valid; the previous rules stay "
                         "in force: "
                      << table.status().message();
    return table.status();
  }
  KVPOOL_LOG(INFO) << "credentials reloaded from " << path_ << ": " << table->size() << " rules";
  auto fresh = std::make_shared<const CredentialTable>(*std::move(table));
  absl::MutexLock lock(&mu_);
  table_ = std::move(fresh);
  return absl::OkStatus();
}

absl::StatusOr<Identity> Authenticator::Admit(const grpc::ServerContextBase& context, Rpc rpc,
                                              absl::string_view segment) {
  if (!enabled()) return AdmitPresented({}, rpc, segment);
  return AdmitPresented(CredentialsOf(context), rpc, segment);
}

absl::StatusOr<Identity> Authenticator::AdmitHttp(const std::optional<std::string>& token) {
  if (!enabled()) return Identity{.name = "anonymous", .role = Role::kAdmin};
  std::shared_ptr<const CredentialTable> table;
  {
    absl::ReaderMutexLock lock(&mu_);
    table = table_;
  }
  Refusal refusal = Refusal::kNone;
  absl::StatusOr<Identity> identified = table->Identify({.token = token}, &refusal);
  if (!identified.ok()) {
    http_refusals_[static_cast<size_t>(refusal)].fetch_add(1, std::memory_order_relaxed);
    return absl::UnauthenticatedError(
        absl::StrCat("HTTP refused: ", identified.status().message(),
                     " (send \"Authorization: Bearer <token>\" of role reader or admin)"));
  }
  if (identified->role != Role::kReader && identified->role != Role::kAdmin) {
    http_refusals_[static_cast<size_t>(Refusal::kWrongRole)].fetch_add(1,
                                                                       std::memory_order_relaxed);
    return absl::PermissionDeniedError(absl::StrCat("HTTP refused: \"", identified->name,
                                                    "\" has role ", RoleName(identified->role),
                                                    "; reader or admin may read these pages"));
  }
  return identified;
}

absl::StatusOr<Identity> Authenticator::AdmitPresented(const PresentedCredentials& presented,
                                                       Rpc rpc, absl::string_view segment) {
  Identity identity{.name = "anonymous", .role = Role::kAdmin};
  Refusal refusal = Refusal::kNone;
  absl::Status status = absl::OkStatus();
  if (enabled()) {
    std::shared_ptr<const CredentialTable> table;
    {
      absl::ReaderMutexLock lock(&mu_);
      table = table_;
    }
    absl::StatusOr<Identity> identified = table->Identify(presented, &refusal);
    if (identified.ok()) {
      identity = *std::move(identified);
      status = Authorize(rpc, identity, segment, &refusal);
    } else {
      status = absl::UnauthenticatedError(
          absl::StrCat(RpcName(rpc), " refused: ", identified.status().message()));
    }
  }
  if (!status.ok()) {
    refusals_[static_cast<size_t>(rpc)][static_cast<size_t>(refusal)].fetch_add(
        1, std::memory_order_relaxed);
    return status;
  }
  CountTenant(identity.tenant);
  return identity;
}

void Authenticator::CountTenant(const std::string& tenant) {
  std::atomic<uint64_t>* counter = nullptr;
  {
    absl::ReaderMutexLock lock(&mu_);
    if (auto it = tenant_calls_.find(tenant); it != tenant_calls_.end()) counter = it->second.get();
  }
  if (counter == nullptr) {
    absl::MutexLock lock(&mu_);
    auto& slot = tenant_calls_[tenant];
    if (!slot) slot = std::make_unique<std::atomic<uint64_t>>(0);
    counter = slot.get();
  }
  counter->fetch_add(1, std::memory_order_relaxed);
}

uint64_t Authenticator::Refusals(Rpc rpc, Refusal refusal) const {
  return refusals_[static_cast<size_t>(rpc)][static_cast<size_t>(refusal)].load();
}

uint64_t Authenticator::HttpRefusals(Refusal refusal) const {
  return http_refusals_[static_cast<size_t>(refusal)].load();
}

uint64_t Authenticator::TenantCalls(const std::string& tenant) const {
  absl::ReaderMutexLock lock(&mu_);
  auto it = tenant_calls_.find(tenant);
  return it == tenant_calls_.end() ? 0 : it->second->load();
}

std::vector<prometheus::MetricFamily> Authenticator::Collect() const {
  MetricFamilies families;
  constexpr char kRefusalsHelp[] =
      "Master calls refused by authentication (UNAUTHENTICATED) or authorization "
      "(PERMISSION_DENIED), per surface (grpc, http), method and reason.";
  for (size_t rpc = 0; rpc < refusals_.size(); ++rpc) {
    for (size_t why = 1; why < refusals_[rpc].size(); ++why) {
      families.Counter("kvpool_auth_refusals_total", kRefusalsHelp,
                       static_cast<double>(refusals_[rpc][why].load()),
                       {{"surface", "grpc"},
                        {"method", RpcName(static_cast<Rpc>(rpc))},
                        {"reason", RefusalName(static_cast<Refusal>(why))}});
    }
  }
  // Pages of the HTTP server (only GET is served): the reasons a token can be refused for.
  for (Refusal why : {Refusal::kNoCredentials, Refusal::kUnknownToken, Refusal::kWrongRole}) {
    families.Counter("kvpool_auth_refusals_total", kRefusalsHelp,
                     static_cast<double>(http_refusals_[static_cast<size_t>(why)].load()),
                     {{"surface", "http"}, {"method", "GET"}, {"reason", RefusalName(why)}});
  }
  absl::ReaderMutexLock lock(&mu_);
  families.Gauge("kvpool_auth_enabled", "1 if callers must authenticate (--auth-tokens).",
                 enabled() ? 1 : 0);
  families.Gauge("kvpool_auth_rules", "Rules of the credentials file in force.",
                 table_ ? static_cast<double>(table_->size()) : 0);
  for (const auto& [tenant, calls] : tenant_calls_) {
    families.Counter("kvpool_tenant_calls_total",
                     "Master calls admitted, per tenant of the caller (\"\": global namespace).",
                     static_cast<double>(calls->load()), {{"tenant", tenant}});
  }
  return families.Take();
}

}  // namespace kvpool::master
