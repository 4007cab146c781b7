#pragma once

// Keeps a segment mounted on the master and its manifest in step. Mounts (retrying until
// the master answers), reports the manifest after a master restart (RestoreManifest), then
// heartbeats as a long poll: each call carries the last manifest record applied and comes
// back with the next ones, at once or after about a heartbeat interval. Mounts again
// whenever the master says it does not know the segment. Unmounts on Stop(). Owns one
// background thread. Thread-safe.
//
// With several masters (master_address a list or etcd://, see proto/master_locator.h) it
// mounts on the leader: a standby's answer sends it to the leader it names; a master that
// stops answering heartbeats (twice in a row) or answers as a standby is left for the next,
// and the segment mounts there afresh (a new term of its grants, its manifest reported). It
// never follows a master whose term is older than one it already followed.

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/log_limiter.h"
#include "proto/tls.h"
#include "server/segment/grant_table.h"
#include "server/segment/manifest.h"

namespace kvpool {
class MasterLocator;
}

namespace grpc {
class ClientContext;
}

namespace kvpool::segment {

struct MasterLinkOptions {
  std::string master_address;  // "host:port", "host:port,host:port...", or "etcd://..."
  // TLS to the master (its CA; this segment's certificate for mutual TLS), and the bearer
  // token the master knows this segment by (its identity must be `name`).
  ClientTlsOptions tls;
  std::string auth_token;
  std::string name;
  std::string host;
  std::string endpoint;  // data plane, as clients should dial it
  std::string shm_socket;  // for same-host clients; empty if none
  uint64_t size = 0;
  uint64_t incarnation = 0;
  absl::Duration rpc_timeout = absl::Seconds(3);
  absl::Duration retry_interval = absl::Milliseconds(500);
  // Called (once) when the master says the segment was drained: it should stop.
  std::function<void()> on_drained;
  // Print "kvpool-segment mounted master=... objects=N" on stdout at every mount.
  bool print_mounts = false;
  // Whether [offset, offset + size) of the pool holds bytes of this checksum. A commit (ADD
  // record) with a checksum whose range does not is refused back to the master instead of
  // applied (docs/semantics.md, "Grants"). Unset: every commit is applied. Called only for
  // ranges the grant table has no landed checksum of (GrantTable::End): those written by
  // shared memory or RDMA, or not in one whole TCP write.
  std::function<bool(uint64_t offset, uint64_t size, uint64_t checksum)> holds_bytes;
  // A range its grant's shared-memory writer said it wrote in full (a done write intent, no
  // other write of the grant since) is taken as holding the writer's bytes without hashing
  // it (readers still check the checksum), unless this is set: then it is hashed like a
  // range nothing is known of. Only where holds_bytes is set.
  bool hash_shm_commits = false;
};

class MasterLink {
 public:
  // Both must outlive the link. Every mount the master accepts starts a new term of
  // `grants` (a new token secret, told to the master; until then the previous one holds);
  // the grants the master ends are ended in `grants` before they are acknowledged.
  MasterLink(MasterLinkOptions options, Manifest& manifest, GrantTable& grants);
  ~MasterLink();
  MasterLink(const MasterLink&) = delete;
  MasterLink& operator=(const MasterLink&) = delete;

  void Start();
  // Stops heartbeating and, if mounted, unmounts (best effort, within rpc_timeout).
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

  bool mounted() const { return mounted_.load(); }
  // Whether the master has surely not declared this segment dead by `now`: a heartbeat the
  // master answered was sent less than half its segment TTL ago. Reads by key stop otherwise
  // (a segment cut off from the master may have missed removals).
  bool in_touch(absl::Time now) const {
    return now < absl::FromUnixNanos(in_touch_until_ns_.load(std::memory_order_relaxed));
  }
  // The master mounted on now ("" if none) and the highest term followed so far.
  std::string master() const ABSL_LOCKS_EXCLUDED(mu_);
  int64_t term() const { return term_.load(); }
  // Number of successful mounts so far (re-mounts after a master restart included).
  uint64_t mount_count() const { return mount_count_.load(); }
  // Commits checked against holds_bytes: by comparing the checksum their TCP write landed
  // with, by hashing the range; and those refused.
  uint64_t commits_compared() const { return commits_compared_.load(); }
  uint64_t commits_hashed() const { return commits_hashed_.load(); }
  uint64_t commits_refused() const { return commits_refused_.load(); }
  // Commits of shared-memory writes taken on their done intents, without hashing.
  uint64_t commits_by_intent() const { return commits_by_intent_.load(); }

 private:
  void Loop() ABSL_LOCKS_EXCLUDED(mu_);
  // A master answered with `term`: Ok, or FailedPrecondition when it is older than one
  // already followed (a deposed leader).
  absl::Status CheckTerm(const std::string& master, int64_t term);
  // Leaves the master mounted on for the next one (several masters only).
  void MoveOn(const std::string& leader_hint);
  absl::Status Mount();
  absl::Status Heartbeat();
  void Unmount();
  bool HoldsBytes(const v1::ManifestRecord& record,
                  const std::optional<GrantTable::Landed>& landed);

  const MasterLinkOptions options_;
  Manifest& manifest_;
  GrantTable& grants_;
  std::unique_ptr<MasterLocator> locator_;
  mutable absl::Mutex mu_;
  // The master mounted on (or being mounted on).
  std::string master_ ABSL_GUARDED_BY(mu_);
  std::atomic<int64_t> term_{0};
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // The heartbeat the master is holding (a long poll), for Stop to cancel.
  grpc::ClientContext* heartbeat_call_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::atomic<bool> mounted_{false};
  std::atomic<uint64_t> mount_count_{0};
  std::atomic<uint64_t> commits_compared_{0}, commits_hashed_{0}, commits_refused_{0};
  std::atomic<uint64_t> commits_by_intent_{0};
  // A heartbeat's send time plus half the TTL (in_touch), Unix nanoseconds.
  std::atomic<int64_t> in_touch_until_ns_{0};
  // Loop thread only.
  absl::Duration heartbeat_interval_ = absl::Seconds(1);
  absl::Duration segment_ttl_ = absl::Seconds(10);
  uint64_t acked_seq_ = 0;
  int heartbeat_failures_ = 0;
  // The last heartbeat failed: the next is a probe (no long poll, a short deadline).
  bool last_heartbeat_failed_ = false;
  // ADD records (by sequence number) refused and not yet reported to this master.
  std::vector<uint64_t> refused_seqs_;
  LogLimiter refusal_log_;  // a line a second at most
  std::thread thread_;
};

}  // namespace kvpool::segment
