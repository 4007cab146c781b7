#pragma once

// Real kvpool processes for integration tests, on free loopback ports (port 0), started and
// waited for by their readiness lines, never by sleeping. Everything stops with its owner.

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "tests/harness/process.h"

namespace kvpool::testing {

// Paths of the binaries under test (set by CMake).
std::string MasterBinary();
std::string SegmentBinary();
std::string CtlBinary();

// Removes a file when destroyed: the shared-memory socket of a server that a test killed
// (SIGKILL leaves it behind). Moving hands the duty over.
class FileRemover {
 public:
  FileRemover() = default;
  explicit FileRemover(std::string path) : path_(std::move(path)) {}
  FileRemover(FileRemover&& other) noexcept : path_(std::exchange(other.path_, "")) {}
  FileRemover& operator=(FileRemover&& other) noexcept;
  ~FileRemover();

 private:
  std::string path_;
};

// Members are destroyed in reverse order: the process dies before its socket is removed.
struct MasterProcess {
  FileRemover embedded_shm_socket;
  std::unique_ptr<Process> process;
  std::string grpc;              // "HOST:PORT"
  std::string http;              // "HOST:PORT"
  std::string embedded_segment;  // data endpoint, or "none"
};

// Starts kvpool-master on free ports with `extra_args` (e.g. "--embedded-segment-size=0").
// Pass `listen` to reuse a known gRPC address (restarting a master in place). On `host`, its
// HTTP and embedded segment listen on the host's address (`listen` should too).
absl::StatusOr<MasterProcess> StartMaster(const std::vector<std::string>& extra_args,
                                          const std::string& listen = "127.0.0.1:0",
                                          const Host& host = {});

struct SegmentProcess {
  FileRemover shm_socket;
  std::unique_ptr<Process> process;
  std::string name;
  std::string data;  // data-plane endpoint
  std::string http;
  std::string shm;   // shared-memory socket path, or "none"
};

// Starts kvpool-segment with a pool of `size` ("64MiB") on free ports of `host` and waits
// until it is mounted.
absl::StatusOr<SegmentProcess> StartSegment(const std::string& master, const std::string& size,
                                            const std::vector<std::string>& extra_args = {},
                                            const Host& host = {});

}  // namespace kvpool::testing
