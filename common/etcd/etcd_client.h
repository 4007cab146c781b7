#pragma once

// A small client of etcd's v3 API over gRPC: what leader election and the lookup of the
// leader need (leases, a create-if-absent transaction, reads, and watching one key), no more.
// Every call has a deadline (rpc_timeout); a failed call moves on to the next endpoint, so a
// cluster of several etcd members is served by whichever answers. Thread-safe.
//
// Errors: Unavailable or DeadlineExceeded when no etcd member answered (retry later);
// NotFound for a lease etcd no longer has; InvalidArgument for malformed endpoints.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace kvpool::etcd {

struct KeyValue {
  std::string key;
  std::string value;
  // Revision of the store when the key was created (its creation's "term") and last changed.
  int64_t create_revision = 0;
  int64_t mod_revision = 0;
  // Lease the key is attached to (0: none).
  int64_t lease = 0;
};

struct Lease {
  int64_t id = 0;
  // As etcd granted it (etcd may round a very short TTL up).
  absl::Duration ttl;
};

struct CreateResult {
  // True: the key did not exist and is now ours; revision is the store's revision at which
  // it was created. False: `existing` holds what is there (absent only if it vanished between
  // the transaction's comparison and its read).
  bool created = false;
  int64_t revision = 0;
  std::optional<KeyValue> existing;
};

class EtcdClient {
 public:
  // `endpoints`: "host:port[,host:port...]" (a leading "http://" per endpoint is accepted).
  static absl::StatusOr<std::unique_ptr<EtcdClient>> Create(
      absl::string_view endpoints, absl::Duration rpc_timeout = absl::Seconds(1));
  ~EtcdClient();

  absl::StatusOr<Lease> GrantLease(absl::Duration ttl);
  // One keep-alive round trip: the TTL the lease has again. NotFound if the lease expired
  // (or was revoked): whatever was attached to it is gone.
  absl::StatusOr<absl::Duration> KeepAlive(int64_t lease);
  // Ends the lease at once; the keys attached to it are deleted.
  absl::Status RevokeLease(int64_t lease);

  // Creates `key` = `value` attached to `lease` (0: none) if no such key exists, in one
  // transaction; otherwise reads what is there.
  absl::StatusOr<CreateResult> CreateIfAbsent(const std::string& key, const std::string& value,
                                              int64_t lease);
  absl::Status Put(const std::string& key, const std::string& value, int64_t lease);
  // nullopt if there is no such key.
  absl::StatusOr<std::optional<KeyValue>> Get(const std::string& key);
  // Every key starting with `prefix`, in key order.
  absl::StatusOr<std::vector<KeyValue>> GetPrefix(const std::string& prefix);
  absl::Status Delete(const std::string& key);
  // Blocks until `key` is put or deleted at a revision after `after_revision`, or `timeout`
  // passes. True if it changed (or etcd compacted past after_revision: read it again).
  absl::StatusOr<bool> WaitForChange(const std::string& key, int64_t after_revision,
                                     absl::Duration timeout);

  // The endpoints, as given.
  const std::vector<std::string>& endpoints() const { return endpoints_; }

 private:
  struct Stubs;
  explicit EtcdClient(std::vector<std::string> endpoints, absl::Duration rpc_timeout);
  static std::shared_ptr<Stubs> MakeStubs(const std::string& endpoint);
  // The endpoint to use now, and after a failed call the next one.
  std::shared_ptr<Stubs> Current() ABSL_LOCKS_EXCLUDED(mu_);
  void Failed(const Stubs& stubs) ABSL_LOCKS_EXCLUDED(mu_);
  // One unary RPC on the current endpoint under rpc_timeout_: `invoke(stubs, context)` makes
  // the call; a failed endpoint is marked (Failed) so that the next call tries another.
  template <typename Invoke>
  absl::Status Unary(const char* method, Invoke invoke) ABSL_LOCKS_EXCLUDED(mu_);

  const std::vector<std::string> endpoints_;
  const absl::Duration rpc_timeout_;
  absl::Mutex mu_;
  std::vector<std::shared_ptr<Stubs>> stubs_ ABSL_GUARDED_BY(mu_);
  size_t current_ ABSL_GUARDED_BY(mu_) = 0;
};

// Splits "host:port,host:port" (optionally each "http://host:port") into host:port strings.
// InvalidArgument if empty or one is not host:port.
absl::StatusOr<std::vector<std::string>> ParseEndpoints(absl::string_view endpoints);

}  // namespace kvpool::etcd
