#pragma once

// A pool the bench starts for itself (--start-pool): a kvpool-master with an embedded segment,
// or a master without one and `segments` kvpool-segment processes, all on free loopback ports,
// every pool page touched up front (--prefault), so measurements start on warm memory.

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/tools/bench/child_process.h"

namespace kvpool::bench {

struct LocalPoolOptions {
  std::string master_binary;
  std::string segment_binary;  // needed only when segments > 0
  // Bytes of pool in all, split evenly over the segments.
  uint64_t pool_bytes = 4ull << 30;
  // 0: one segment embedded in the master.
  int segments = 0;
  // Data-plane threads of each segment.
  int server_threads = 2;
  // Extra arguments, e.g. "--lease-ttl=30s".
  std::vector<std::string> master_args;
  std::vector<std::string> segment_args;
  // Where the servers' logs go.
  std::string log_dir;
};

struct LocalPool {
  std::string master;                                    // gRPC address
  std::vector<std::unique_ptr<ChildProcess>> processes;  // master first
};

absl::StatusOr<LocalPool> StartLocalPool(const LocalPoolOptions& options);

}  // namespace kvpool::bench
