#pragma once

// Lets clients on this host map the segment's pool directly. Listens on a Unix socket; a
// client that connects and says hello is checked by its credentials (SO_PEERCRED): an
// admitted uid receives the pool's memfd (SCM_RIGHTS) and from then on copies straight to
// and from the pool with memcpy, the master's placements still deciding where. Others are
// refused with the reason (and use TCP). Owns one thread. Thread-safe.
//
// An admitted client can read and write the whole pool: admit only uids trusted like the
// segment itself (by default its own uid and root).

#include <sys/types.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "server/segment/memory_pool.h"

namespace kvpool::segment {

struct ShmAdmissionOptions {
  // Path of the Unix socket (a stale file there is replaced).
  std::string socket_path;
  // Admitted uids; empty: the segment's own uid and root. `any_uid` admits everyone.
  std::vector<uid_t> uids;
  bool any_uid = false;
  // The segment's incarnation, told to admitted clients.
  uint64_t incarnation = 0;
};

// Parses an admission list: "" (the segment's own uid and root), "any", or "1000,1001"
// (exactly those uids).
absl::Status ParseAdmittedUids(absl::string_view text, ShmAdmissionOptions* options);

class ShmAdmission {
 public:
  ShmAdmission(const MemoryPool& pool, ShmAdmissionOptions options);
  ~ShmAdmission();
  ShmAdmission(const ShmAdmission&) = delete;
  ShmAdmission& operator=(const ShmAdmission&) = delete;

  // Unavailable (with the OS reason) if the socket cannot be bound.
  absl::Status Start();
  // Stops accepting and removes the socket file. Mappings already handed out stay valid.
  void Stop();

  const std::string& socket_path() const { return options_.socket_path; }
  uint64_t admitted() const { return admitted_.load(); }
  uint64_t refused() const { return refused_.load(); }

 private:
  void Loop();
  void Serve(int fd);
  bool Admits(uid_t uid) const;

  const MemoryPool& pool_;
  const ShmAdmissionOptions options_;
  int listen_fd_ = -1;
  int stop_fd_ = -1;  // eventfd that wakes the loop
  std::thread thread_;
  std::atomic<uint64_t> admitted_{0};
  std::atomic<uint64_t> refused_{0};
};

}  // namespace kvpool::segment
