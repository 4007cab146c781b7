#pragma once

// Starts the pool's real processes for integration tests: kvpool-master and kvpool-segment
// on free loopback ports (port 0), ready when their readiness lines are printed.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine_plugin/testing/child_process.h"

namespace kvpool::engine::testing {

struct MasterProcess {
  std::unique_ptr<ChildProcess> process;
  std::string grpc_address;
  std::string http_address;
  std::string embedded_segment;  // "none" without one
  uint64_t embedded_size = 0;
};

// `embedded_segment_size`: "64MiB", or "0" for none. Extra flags are appended.
absl::StatusOr<MasterProcess> StartMaster(const std::string& binary,
                                          const std::string& embedded_segment_size,
                                          const std::vector<std::string>& extra_flags = {});

struct SegmentProcess {
  std::unique_ptr<ChildProcess> process;
  std::string name;
  std::string data_address;
  std::string http_address;
};

// Returns once the segment is mounted on the master.
absl::StatusOr<SegmentProcess> StartSegment(const std::string& binary,
                                            const std::string& master_address,
                                            const std::string& size,
                                            const std::vector<std::string>& extra_flags = {});

}  // namespace kvpool::engine::testing
