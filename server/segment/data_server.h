#pragma once

// Serves reads and writes of byte ranges of a MemoryPool over TCP (Boost.Asio), speaking the
// frame protocol of proto/frame.h. Bytes move straight between the socket and the pool.
//
// Every request is checked before any byte moves: its range must lie inside the pool and
// its capability token must grant exactly that range and opcode. A request that fails a
// check, or a header that does not decode, gets an error response with the reason and the
// connection is closed; other connections are unaffected. Thread-safe.

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "common/latency_histogram.h"
#include "rdma/rdma_device.h"
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
  // Threads that run the Asio event loop.
  int threads = 2;
  // Refuse requests without a valid capability token. Off only for tests and benchmarks.
  bool require_token = true;
  // Socket buffer sizes (0: the kernel's default).
  int socket_buffer_bytes = 4 << 20;
  // Creates a queue pair for a client's RDMA connect; unset: RDMA is off on this segment.
  std::function<absl::StatusOr<RdmaAccept>(const rdma::QueuePairInfo& client)> rdma_accept;
};

class DataServer {
 public:
  // `manifest` (may be null: an embedded segment keeps none) loses the entries that an
  // accepted write overlaps. Both must outlive the server.
  DataServer(const MemoryPool& pool, std::string token_secret, DataServerOptions options,
             Manifest* manifest = nullptr);
  ~DataServer();
  DataServer(const DataServer&) = delete;
  DataServer& operator=(const DataServer&) = delete;

  // Listens on "ip:port" (port 0: any free port) and returns the bound port.
  absl::StatusOr<uint16_t> Start(const std::string& address);
  void Stop();

  struct Stats {
    uint64_t reads = 0;
    uint64_t writes = 0;
    uint64_t bytes_read = 0;     // served to clients
    uint64_t bytes_written = 0;  // received from clients
    uint64_t rejected = 0;       // requests refused, all reasons
    uint64_t rejected_malformed = 0;
    uint64_t rejected_range = 0;
    uint64_t rejected_token = 0;
    uint64_t rejected_expired = 0;
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
