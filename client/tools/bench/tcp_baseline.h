#pragma once

// The raw loopback TCP ceiling: plain blocking sockets that move the same bytes as kvpool over
// the same number of connections, to a sink/source server inside the bench process, with a
// thread at each end of every connection.
//
// A client thread's batch of `batch_size` values is dealt over `lanes` connections, each with
// its own client thread; one call of a worker is one request/response exchange of its share:
//   get: a 16-byte request; the server answers with count x value_size bytes (one sendmsg
//        from its own memory, as large in all as kvpool's working set), read straight into
//        the worker's slots (one readv).
//   put: a 16-byte header and count x value_size bytes (one sendmsg from the worker's slots);
//        the server reads them into its memory and answers 8 bytes.
// There are no keys, tokens or master: this is what the wire alone allows.
//
// "tcp-rtt" (TcpRttBaseline) is the round trip of a small message on one connection: a
// 16-byte request answered by 16 bytes, the latency a single get is compared with.

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "client/tools/bench/io.h"
#include "client/tools/bench/system.h"

namespace kvpool::bench {

class TcpBaseline : public System {
 public:
  // `socket_buffer_bytes`: SO_SNDBUF/SO_RCVBUF of both ends (0: the kernel's autotuning).
  // `rtt`: measure the small-message round trip (tcp-rtt) instead of moving values.
  static absl::StatusOr<std::unique_ptr<TcpBaseline>> Start(int socket_buffer_bytes, bool rtt);
  ~TcpBaseline() override;

  std::string name() const override { return rtt_ ? "tcp-rtt" : "tcp"; }
  std::string Describe(const Workload& workload) const override;
  bool Supports(WorkloadKind kind) const override;
  absl::StatusOr<std::vector<std::unique_ptr<Worker>>> MakeWorkers(
      const Workload& workload) override;
  // Joins the server threads (the workers, destroyed first, closed their connections).
  void Finish(const Workload& workload) override;

 private:
  TcpBaseline(int listen_fd, uint16_t port, int socket_buffer_bytes, bool rtt)
      : listen_fd_(listen_fd), port_(port), socket_buffer_bytes_(socket_buffer_bytes), rtt_(rtt) {}
  // The server end of one connection: answers requests until the client closes it.
  static void Serve(int fd, SlotRing& ring);

  const int listen_fd_;
  const uint16_t port_;
  const int socket_buffer_bytes_;
  const bool rtt_;
  std::vector<std::thread> servers_;
};

}  // namespace kvpool::bench
