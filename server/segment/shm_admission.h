#pragma once

// Lets clients on this host map the segment's pool directly. Listens on a Unix socket; a
// client that connects and says hello is checked by its credentials (SO_PEERCRED, logged):
// an admitted uid (or a member of the allowed group) receives the pool's memfd (SCM_RIGHTS,
// sealed against shrinking and growing) and from then on copies straight to and from the
// pool with memcpy, the master's placements still deciding where. Others are refused with
// the reason (and use TCP). The socket file is reachable only by the owner (and the allowed
// group): mode 0600, or 0660 with a group, 0666 only for `any_uid`.
//
// An admitted client keeps its connection for as long as it has the pool mapped and fences
// its writes on it with write intents (proto/shm_handshake.h): each is checked by `grants`
// as a TCP write's header would be (GrantTable::BeginWrite, WriteKind::kShm) and, once
// accepted, holds its range until the client says it is done or the connection closes (the
// process exited or was killed). Admitted connections have no idle timeout.
//
// Handshakes and intents are multiplexed on one thread, each handshake on its own deadline
// (handshake_timeout): a silent peer delays nobody else; no call on that thread blocks (a
// client that does not read its answers is cut off). A socket path that a live segment
// still answers on is not taken over: Start fails. Owns one thread. Thread-safe.
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
#include "server/segment/grant_table.h"
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
  // Admitted connections kept at most (a client process has one per segment); past it new
  // clients are refused (and use TCP).
  size_t max_connections = 4096;
  // Intents one connection may hold open at once; more are refused.
  size_t max_intents_per_connection = 1 << 16;
};

// Parses a group name or number for ShmAdmissionOptions::group ("" leaves it unset).
absl::Status ParseAdmittedGroup(absl::string_view text, ShmAdmissionOptions* options);

// Parses an admission list: "" (the segment's own uid and root), "any", or "1000,1001"
// (exactly those uids).
absl::Status ParseAdmittedUids(absl::string_view text, ShmAdmissionOptions* options);

class ShmAdmission {
 public:
  // `pool` and `grants` must outlive it.
  ShmAdmission(const MemoryPool& pool, GrantTable& grants, ShmAdmissionOptions options);
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
  // Admitted clients connected now; their connections cut for a protocol error.
  uint64_t connections() const { return connections_.load(); }
  uint64_t protocol_errors() const { return protocol_errors_.load(); }

 private:
  struct Client;
  void Loop();
  // Answers a peer whose hello arrived; true if it was admitted (and keeps the connection).
  bool Serve(int fd, const uint8_t* hello, size_t clients);
  bool Admits(const ucred& peer) const;
  // Reads what an admitted client sent and answers its complete messages; false if the
  // connection is to be closed (closed by the peer, or a protocol error).
  bool Receive(Client& client);
  // Handles one message; false for a protocol error.
  bool Handle(Client& client, const uint8_t* message, size_t size);
  // Ends every intent of a closing client.
  void Close(Client& client);

  const MemoryPool& pool_;
  GrantTable& grants_;
  const ShmAdmissionOptions options_;
  int listen_fd_ = -1;
  int stop_fd_ = -1;  // eventfd that wakes the loop
  std::thread thread_;
  std::atomic<uint64_t> admitted_{0};
  std::atomic<uint64_t> refused_{0};
  std::atomic<uint64_t> timed_out_{0};
  std::atomic<uint64_t> connections_{0};
  std::atomic<uint64_t> protocol_errors_{0};
  LogLimiter refusal_log_;

 public:
  // Peers dropped for not sending a hello in time (or to make room).
  uint64_t timed_out() const { return timed_out_.load(); }
};

}  // namespace kvpool::segment
