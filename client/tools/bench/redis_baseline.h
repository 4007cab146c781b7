#pragma once

// Redis as users would deploy it instead: SET and GET of the same values over RESP, spoken
// by the bench over plain blocking sockets (no client library), with the same concurrency as
// kvpool: a client thread's batch is dealt over `lanes` connections, one thread each, and
// each connection pipelines its share of the batch (all commands sent, then all replies
// read), as kvpool pipelines a batch's frames. GET replies are read straight into the
// thread's buffers (the RESP header through a small buffer, the value with readv), SET
// commands are sent from them (writev), so no side copies more than the protocol needs.
//
//   get        GET of working-set keys stored by Prepare ("kvb:RUN:vSIZE:I")
//   put        SET of keys that rotate over a per-connection range of `keys / connections`
//              (Redis overwrites in place; kvpool, whose objects are immutable, writes new ones)
//   meta-exist one EXISTS command naming `batch_size` keys of a small-value working set
//
// The bench starts redis-server itself (loopback, a free port, no persistence) unless given
// the address of one (--redis); Cleanup deletes the bench's keys.

#include <sys/types.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "client/tools/bench/system.h"

namespace kvpool::bench {

class ChildProcess;

class RedisBaseline : public System {
 public:
  // Uses the server at host:port.
  static absl::StatusOr<std::unique_ptr<RedisBaseline>> Connect(const std::string& address);
  // Starts `binary` (redis-server) on 127.0.0.1 and a free port, logging to `log_path`.
  static absl::StatusOr<std::unique_ptr<RedisBaseline>> Launch(const std::string& binary,
                                                               const std::string& log_path);
  ~RedisBaseline() override;

  std::string name() const override { return "redis"; }
  std::string Describe(const Workload& workload) const override;
  bool Supports(WorkloadKind kind) const override;
  absl::Status Prepare(const Workload& workload) override;
  absl::StatusOr<std::vector<std::unique_ptr<Worker>>> MakeWorkers(
      const Workload& workload) override;
  // Deletes every key the bench stored.
  void Cleanup();

  const std::string& address() const { return address_; }
  // The redis-server the bench started (null when it uses one it was given).
  ChildProcess* process() const { return process_.get(); }

 private:
  RedisBaseline(std::string host, uint16_t port, std::unique_ptr<ChildProcess> process);

  const std::string host_;
  const uint16_t port_;
  const std::string address_;
  std::unique_ptr<ChildProcess> process_;
  std::string version_;
  // Keys the bench stored: prefix+0 .. prefix+(count-1) per entry.
  std::vector<std::pair<std::string, uint64_t>> stored_;
};

}  // namespace kvpool::bench
