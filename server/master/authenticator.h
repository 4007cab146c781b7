#pragma once

// Authentication and authorization of every master RPC, in one place: reads what the caller
// presented from the gRPC context (an "authorization: Bearer <token>" metadata entry, a client
// certificate the TLS handshake verified), identifies it with the CredentialTable, checks the
// policy (auth_policy.h) and counts refusals per RPC and reason for /metrics. Each handler of
// MasterGrpcService calls Admit first. Thread-safe.

#include <array>
#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include "absl/strings/string_view.h"
#include <sys/stat.h>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "prometheus/metric_family.h"
#include "server/master/auth_policy.h"
#include "server/master/credential_table.h"
#include "server/master/master_metrics.h"

namespace grpc {
class ServerContextBase;
}

namespace kvpool::master {

// What a caller presented on a call, read from its gRPC context.
PresentedCredentials CredentialsOf(const grpc::ServerContextBase& context);

class Authenticator {
 public:
  // Authentication off: every caller is "anonymous", an admin of the global namespace (a pool
  // bound to loopback, or one started with --insecure).
  Authenticator() = default;
  // Authentication on, with the rules of `path` (see credential_table.h); errors as Load.
  static absl::StatusOr<std::unique_ptr<Authenticator>> FromFile(const std::string& path);

  bool enabled() const { return !path_.empty(); }

  // The caller's identity if it may call `rpc` (acting on segment `segment`, for a segment's
  // RPCs), else Unauthenticated (no or unknown credentials) or PermissionDenied (role, or
  // another segment's name), with a message for the caller. Each refusal is counted.
  absl::StatusOr<Identity> Admit(const grpc::ServerContextBase& context, Rpc rpc,
                                 absl::string_view segment) ABSL_LOCKS_EXCLUDED(mu_);
  // The same, from credentials already read (tests; no gRPC).
  absl::StatusOr<Identity> AdmitPresented(const PresentedCredentials& presented, Rpc rpc,
                                          absl::string_view segment) ABSL_LOCKS_EXCLUDED(mu_);

  // The HTTP endpoints (/metrics, /get_all_segments): a bearer token of role reader or admin,
  // else Unauthenticated (none or unknown) or PermissionDenied (another role). Each refusal
  // is counted (HttpRefusals; surface="http" in the metrics). Everyone is admitted when
  // authentication is off.
  absl::StatusOr<Identity> AdmitHttp(const std::optional<std::string>& token)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Re-reads the file if its modification time or size changed (token rotation, a new
  // segment). A file that no longer parses keeps the rules in force; the error is returned.
  absl::Status ReloadIfChanged() ABSL_LOCKS_EXCLUDED(mu_);

  uint64_t Refusals(Rpc rpc, Refusal refusal) const;
  uint64_t HttpRefusals(Refusal refusal) const;
  // Accepted calls per tenant ("" is the global namespace) so far.
  uint64_t TenantCalls(const std::string& tenant) const ABSL_LOCKS_EXCLUDED(mu_);

  // kvpool_auth_refusals_total{surface,method,reason}, kvpool_auth_rules,
  // kvpool_tenant_calls_total{tenant}.
  std::vector<prometheus::MetricFamily> Collect() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void CountTenant(const std::string& tenant) ABSL_LOCKS_EXCLUDED(mu_);

  std::string path_;
  mutable absl::Mutex mu_;
  std::shared_ptr<const CredentialTable> table_ ABSL_GUARDED_BY(mu_);
  struct FileStamp {
    int64_t mtime_ns = 0;
    int64_t size = -1;
    bool operator==(const FileStamp&) const = default;
  };
  FileStamp stamp_ ABSL_GUARDED_BY(mu_);
  // Entries are created once and never removed.
  absl::flat_hash_map<std::string, std::unique_ptr<std::atomic<uint64_t>>> tenant_calls_
      ABSL_GUARDED_BY(mu_);
  std::array<std::array<std::atomic<uint64_t>, static_cast<size_t>(Refusal::kCount)>,
             static_cast<size_t>(Rpc::kCount)>
      refusals_{};
  std::array<std::atomic<uint64_t>, static_cast<size_t>(Refusal::kCount)> http_refusals_{};
};

}  // namespace kvpool::master
