#pragma once

// The TCP transport: frames of proto/frame.h over pooled connections to each segment.
// A batch is spread over up to `connections_per_endpoint` connections per segment, all
// segments at once; on each connection requests are pipelined (a window of requests in
// flight). Each connection's lane takes a segment's ops as it goes, a few ahead of its
// answers, so a lane that runs faster takes more and a batch's lanes end together.
// Payloads go straight between the caller's buffers and the socket. With
// `tls` every connection is TLS (client/data_stream.h): the segments must serve
// --data-tls. Thread-safe.

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "client/data_stream.h"
#include "client/transport.h"
#include "common/task_pool.h"

namespace kvpool::client {

struct TcpTransportOptions {
  int connections_per_endpoint = 2;
  // Requests in flight per connection.
  int pipeline_window = 64;
  int socket_buffer_bytes = 4 << 20;
  // Threads that drive connections in parallel (the caller's thread drives one more).
  int threads = 3;
  // TLS on every data connection: segments' certificates verified against tls.ca_file and
  // their names against the host of each endpoint (server_name is not used); tls.cert_file
  // for mutual TLS. Unset: plaintext.
  std::optional<ClientTlsOptions> tls;
};

class TcpTransport final : public Transport {
 public:
  explicit TcpTransport(TcpTransportOptions options);
  ~TcpTransport() override;

  void Execute(absl::Span<TransferOp> ops, absl::Time deadline) override;
  // Every write with `hash` set is hashed in its lane just before it is sent.
  bool HashesWrite(const TransferOp& op) override { return true; }

 private:
  struct PipelineResult {
    // Ops at the front of the list that got their answer (OK or a rejection).
    size_t answered = 0;
    // False once the segment rejected a request: it closes the connection after that.
    bool in_step = true;
    // The connection broke (reset, closed, timed out); the unanswered ops did not run.
    absl::Status io_error;
  };
  struct Lease {
    std::unique_ptr<DataStream> stream;
    bool reused = false;
  };
  // One segment's ops, taken one at a time by its lanes.
  class OpQueue {
   public:
    OpQueue(std::vector<TransferOp*> ops, int lanes)
        : ops_(std::move(ops)), share_((ops_.size() + lanes - 1) / lanes), lanes_(lanes) {}
    // Each lane's part of the ops if they were dealt out evenly: the most a lane takes at once.
    size_t share() const { return share_; }
    // The next op no lane has taken, or null.
    TransferOp* Take() {
      size_t i = next_.fetch_add(1, std::memory_order_relaxed);
      return i < ops_.size() ? ops_[i] : nullptr;
    }
    // A lane gave up on the segment with `error`: the last lane to do so fails what no lane
    // took (a lane that ends well ends only once nothing is left).
    void GiveUp(const absl::Status& error);

   private:
    const std::vector<TransferOp*> ops_;
    const size_t share_;
    std::atomic<size_t> next_{0};
    std::atomic<int> lanes_;
  };

  // Runs ops of `queue` (all for `endpoint`) one connection at a time, until none is left.
  void RunLane(const std::string& endpoint, OpQueue& queue, absl::Time deadline);
  // Sends `ops` from `first` in order, up to the window ahead of the answers, taking more from
  // `queue` (appended to `ops`) while little is in flight, and reads the answers.
  PipelineResult Pipeline(DataStream& stream, const std::string& endpoint, OpQueue& queue,
                          std::vector<TransferOp*>& ops, size_t first, absl::Time deadline);

  absl::StatusOr<Lease> Acquire(const std::string& endpoint, absl::Time deadline)
      ABSL_LOCKS_EXCLUDED(mu_);
  void Release(const std::string& endpoint, std::unique_ptr<DataStream> stream)
      ABSL_LOCKS_EXCLUDED(mu_);

  const TcpTransportOptions options_;
  // With options_.tls: the contexts (or why they could not be made: every op fails so).
  std::shared_ptr<TlsContextSource> tls_;
  absl::Status tls_error_;
  TaskPool tasks_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::vector<std::unique_ptr<DataStream>>> idle_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace kvpool::client
