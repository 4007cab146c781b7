#pragma once

// Lets clients on this host map the segment's pool directly. Listens on a Unix socket; a
// client that connects and says hello is checked by its credentials (SO_PEERCRED, logged):
// an admitted uid (or a member of the allowed group) receives the pool's memfd (SCM_RIGHTS,
// sealed against shrinking and growing) and from then on copies straight to and from the
// pool with memcpy, the master's placements still deciding where. Others are refused with
// the reason (and use TCP). The socket file is reachable only by the owner (and the allowed
// group): mode 0600, or 0660 with a group, 0666 only for `any_uid`.
//
// Handshakes are multiplexed on one thread, each on its own deadline (handshake_timeout):
// a silent peer delays nobody else. A socket path that a live segment still answers on is
// not taken over: Start fails. Owns one thread. Thread-safe.
//
// An admitted client can read and write the whole pool: admit only uids trusted like the
// segment itself (by default its own uid and root).

#include <sys/socket.h>
#include <sys/types.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/log_limiter.h"
#include "server/segment/memory_pool.h"

namespace kvpool::segment {

struct ShmAdmissionOptions {
  // Path of the Unix socket (a stale file there is replaced).
  std::string socket_path;
  // Admitted uids; empty: the segment's own uid and root. `any_uid` admits everyone.
  std::vector<uid_t> uids;
  bool any_uid = false;
  // Members of this group are admitted too, and the socket is made reachable by it
  // (-1: none).
  gid_t group = static_cast<gid_t>(-1);
  // A peer that has not sent its hello by then is dropped.
  absl::Duration handshake_timeout = absl::Seconds(1);
  // Handshakes in progress at most; the oldest is dropped to make room.
  size_t max_pending = 1024;
  // The segment's incarnation, told to admitted clients.
  uint64_t incarnation = 0;
};

// Parses a group name or number for ShmAdmissionOptions::group ("" leaves it unset).
absl::Status ParseAdmittedGroup(absl::string_view text, ShmAdmissionOptions* options);

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
  // Answers a peer whose hello arrived.
  void Serve(int fd, const uint8_t* hello);
  bool Admits(const ucred& peer) const;

  const MemoryPool& pool_;
  const ShmAdmissionOptions options_;
  int listen_fd_ = -1;
  int stop_fd_ = -1;  // eventfd that wakes the loop
  std::thread thread_;
  std::atomic<uint64_t> admitted_{0};
  std::atomic<uint64_t> refused_{0};
  std::atomic<uint64_t> timed_out_{0};
  LogLimiter refusal_log_;

 public:
  // Peers dropped for not sending a hello in time (or to make room).
  uint64_t timed_out() const { return timed_out_.load(); }
};

}  // namespace kvpool::segment
