#pragma once

// A segment hosted inside the engine's own process, as Mooncake's clients contribute
// global_segment_size of their memory to the pool: a MemoryPool, a DataServer serving it and
// a MasterLink that keeps it mounted on the master. Objects placed on it live as long as
// this process (the master drops them when the segment unmounts or stops heartbeating).
// Thread-safe.

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/segment/data_server.h"

namespace kvpool::engine {

struct LocalSegmentOptions {
  std::string master_address;
  uint64_t size = 0;
  // Address the data plane listens on ("127.0.0.1", "0.0.0.0"; port 0 picks a free one).
  std::string listen_host = "127.0.0.1";
  uint16_t listen_port = 0;
  // Host clients dial (default: the listen host, or this machine's name for a wildcard).
  std::string advertise_host;
  // Start() fails if the master has not accepted the mount within this time.
  absl::Duration mount_timeout = absl::Seconds(10);
  // Touch every page up front (slow for big segments; off: pages arrive on first write).
  bool prefault = false;
};

class LocalSegment {
 public:
  // InvalidArgument for a size of 0 or a bad address, ResourceExhausted if the memory cannot
  // be had, Unavailable if the master does not accept the mount within mount_timeout.
  static absl::StatusOr<std::unique_ptr<LocalSegment>> Start(const LocalSegmentOptions& options);
  ~LocalSegment();
  LocalSegment(const LocalSegment&) = delete;
  LocalSegment& operator=(const LocalSegment&) = delete;

  // Unmounts (its objects leave the pool) and stops serving. Safe to call twice.
  void Stop();

  const std::string& name() const;
  const std::string& endpoint() const;
  uint64_t size() const;
  bool mounted() const;
  segment::DataServer::Stats stats() const;

 private:
  struct Impl;
  explicit LocalSegment(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvpool::engine
