#pragma once

// Serves reads and writes of byte ranges of a MemoryPool over TCP (Boost.Asio), speaking the
// frame protocol of proto/frame.h. Bytes move straight between the socket and the pool.
//
// Every request is checked before any byte moves: its range must lie inside the pool and
// its capability token must grant exactly that range and opcode, under the current term, for
// a grant the master has not ended (GrantTable). A READ_KEY names a key instead, under a
// key-read credential of its tenant: the value is the manifest's entry for it, sent only while
// that entry stays in the manifest. A WRITE's payload lands only while its grant
// is open: once it ends (revoke, reclaim, commit, remove, a new term) or its token expires,
// no further byte is stored; each byte that lands is hashed as it lands (checksum_writes).
// A request that fails a check, or a header that does not decode,
// gets an error response with the reason and the connection is closed; other connections are
// unaffected. With DataServerOptions::tls the connections are TLS (the handshake first, under
// request_timeout); a peer that fails the handshake is closed and counted. Thread-safe.

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/latency_histogram.h"
#include "proto/tls.h"
#include "rdma/rdma_device.h"
#include "server/segment/grant_table.h"
#include "server/segment/manifest.h"
#include "server/segment/memory_pool.h"

namespace kvpool::segment {

// What accepting an RDMA connect yields: this side's queue-pair info (pool address and
// remote key included) and the queue pair, kept alive as long as the TCP connection.
struct RdmaAccept {
  rdma::QueuePairInfo info;
  std::shared_ptr<void> queue_pair;
};

struct DataServerOptions {
  // Data-plane threads, each running an event loop of its own; connections are dealt
  // round-robin over them, so a connection's requests are always served by one thread.
  int threads = 2;
  // Refuse requests without a valid capability token. Off only for tests and benchmarks.
  bool require_token = true;
  // Socket buffer sizes (0: the kernel's default).
  int socket_buffer_bytes = 4 << 20;
  // Connections served at once; one more is accepted and closed at once (counted).
  int max_connections = 4096;
  // A connection with no request in progress for this long is closed.
  absl::Duration idle_timeout = absl::Minutes(5);
  // A request whose header or WRITE payload has begun to arrive must be complete within
  // this long (a 1-byte-per-second sender is cut off).
  absl::Duration request_timeout = absl::Seconds(30);
  // Hash each WRITE's payload as it lands (XXH3, while the bytes are in cache) and leave the
  // checksum with the grant table, so the commit check is a compare (GrantTable::End).
  bool checksum_writes = true;
  // Creates a queue pair for a client's RDMA connect; unset: RDMA is off on this segment.
  std::function<absl::StatusOr<RdmaAccept>(const rdma::QueuePairInfo& client)> rdma_accept;
  // Reads by key (READ_KEY, proto/key_read.h) look keys up here; null: every READ_KEY is
  // answered OBJECT_NOT_FOUND. Must outlive the server.
  Manifest* manifest = nullptr;
  // Whether reads by key may be served now (a segment out of touch with its master may have
  // missed removals: MasterLink::in_touch); unset: always.
  std::function<bool(absl::Time now)> key_reads_allowed;
  // TLS on every connection (proto/data_tls.h: the files reloaded on change); with
  // client_ca_file clients are asked for certificates of that CA. Unset: plaintext.
  std::optional<ServerTlsOptions> tls;
};

class DataServer {
 public:
  // `pool` must outlive the server; tokens verify under `token_secret` until grants()
  // starts a new term.
  DataServer(const MemoryPool& pool, std::string token_secret, DataServerOptions options);
  ~DataServer();
  DataServer(const DataServer&) = delete;
  DataServer& operator=(const DataServer&) = delete;

  // Listens on "ip:port" (port 0: any free port) and returns the bound port. InvalidArgument
  // for TLS files that do not load.
  absl::StatusOr<uint16_t> Start(const std::string& address);
  void Stop();

  // The grants this server honours: the segment ends them as the master says.
  GrantTable& grants();
  const GrantTable& grants() const;

  struct Stats {
    uint64_t reads = 0;
    uint64_t writes = 0;
    uint64_t key_reads = 0;         // READ_KEY answered with the value
    uint64_t key_reads_missed = 0;  // READ_KEY answered OBJECT_NOT_FOUND (or too large)
    uint64_t bytes_read = 0;     // served to clients
    uint64_t bytes_written = 0;  // received from clients
    uint64_t rejected = 0;       // requests refused, all reasons
    uint64_t rejected_malformed = 0;
    uint64_t rejected_range = 0;
    uint64_t rejected_token = 0;
    uint64_t rejected_expired = 0;
    uint64_t rejected_ended = 0;  // the grant was ended by the master (or a new term)
    uint64_t rejected_busy = 0;   // the range is busy with another grant's shm write
    uint64_t rejected_connection_cap = 0;  // connections refused: max_connections reached
    uint64_t rejected_handshake = 0;       // connections whose TLS handshake failed
    uint64_t closed_idle = 0;              // connections closed: idle or too slow
    uint64_t accept_errors = 0;            // accept failed (EMFILE, ...): backed off
    uint64_t connections = 0;              // open now
    // From a request's header to the last byte of its answer.
    HistogramSnapshot read_latency;
    HistogramSnapshot write_latency;
  };
  Stats stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvpool::segment
