#pragma once

// The segments a client routes to: which run on this machine, and their shared-memory
// sockets. Loaded from MasterClient::ListSegments by Refresh() (Client::Create calls it once,
// so the first reads and writes know this machine's segments) and then by a thread of its
// own, every `period` and soon (at most once a second) after a lookup of an endpoint it did
// not know. Lookups never call the master and take only this directory's own short lock (a
// pointer copy), so a get never waits on the master for routing: an endpoint not known yet
// is routed as remote (TCP) until the next refresh. Thread-safe.

#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/master_client.h"

namespace kvpool::client {

class SegmentDirectory {
 public:
  // `master` must outlive the directory. `machine_id` tells this machine's segments.
  SegmentDirectory(MasterClient& master, std::string machine_id, absl::Duration period);
  // Stops the refresh thread.
  ~SegmentDirectory();
  SegmentDirectory(const SegmentDirectory&) = delete;
  SegmentDirectory& operator=(const SegmentDirectory&) = delete;

  // Loads the list now, on the calling thread; the old list stays if the master fails.
  absl::Status Refresh() ABSL_LOCKS_EXCLUDED(mu_);
  // Starts the background refreshes (once).
  void Start() ABSL_LOCKS_EXCLUDED(mu_);

  // The shared-memory socket of a segment on this machine that offers one.
  std::optional<std::string> ShmSocket(const std::string& endpoint) ABSL_LOCKS_EXCLUDED(mu_);
  // This machine's segments that offer shared memory.
  std::vector<std::string> LocalShmEndpoints() ABSL_LOCKS_EXCLUDED(mu_);
  // Where to read `key` by key (proto/key_read.h): its home among the active segments, with
  // a key-read credential that has at least kCredentialMargin to run; none without one.
  struct KeyHome {
    std::string endpoint;
    bool local = false;  // on this machine, with shared memory
    std::string tenant;
    wire::Token credential{};
  };
  std::optional<KeyHome> HomeOf(absl::string_view key) ABSL_LOCKS_EXCLUDED(mu_);
  static constexpr absl::Duration kCredentialMargin = absl::Seconds(5);
  // Refreshes made so far (for tests).
  uint64_t refreshes() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Snapshot {
    absl::flat_hash_map<std::string, std::string> local;  // endpoint -> socket ("" if none)
    absl::flat_hash_set<std::string> remote;
    std::string tenant;
    std::vector<SegmentEntry> active;  // where keys' homes are
  };
  std::shared_ptr<const Snapshot> Current() ABSL_LOCKS_EXCLUDED(mu_);
  void Loop() ABSL_LOCKS_EXCLUDED(mu_);

  MasterClient& master_;
  const std::string machine_id_;
  const absl::Duration period_;
  absl::Mutex mu_;
  std::shared_ptr<const Snapshot> snapshot_ ABSL_GUARDED_BY(mu_);
  // A lookup missed: refresh soon.
  bool wanted_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t refreshes_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;
};

}  // namespace kvpool::client
