#include "tests/harness/cluster.h"

#include <unistd.h>

#include "absl/strings/str_cat.h"

namespace kvpool::testing {

// Generous: on a loaded 2-core machine a start can take seconds; a healthy one is quick, and
// nothing here sleeps.
constexpr absl::Duration kStartTimeout = absl::Seconds(60);

FileRemover& FileRemover::operator=(FileRemover&& other) noexcept {
  // A server restarted on the same port has the same socket: it is the new one's now.
  if (path_ != other.path_ && !path_.empty()) unlink(path_.c_str());
  path_ = std::exchange(other.path_, "");
  return *this;
}

FileRemover::~FileRemover() {
  if (!path_.empty()) unlink(path_.c_str());
}

std::string MasterBinary() { return KVPOOL_MASTER_BIN; }
std::string SegmentBinary() { return KVPOOL_SEGMENT_BIN; }
std::string CtlBinary() { return KVPOOL_CTL_BIN; }

absl::StatusOr<MasterProcess> StartMaster(const std::vector<std::string>& extra_args,
                                          const std::string& listen, const Host& host) {
  std::vector<std::string> args = {"--listen=" + listen, "--http-listen=" + host.address + ":0",
                                   "--embedded-segment-listen=" + host.address + ":0",
                                   "--prefault=false"};
  args.insert(args.end(), extra_args.begin(), extra_args.end());
  absl::StatusOr<std::unique_ptr<Process>> process = StartOn(host, MasterBinary(), args);
  if (!process.ok()) return process.status();
  absl::StatusOr<std::string> line = (*process)->WaitForLine("kvpool-master listening", kStartTimeout);
  if (!line.ok()) return line.status();
  MasterProcess master;
  master.process = std::move(*process);
  master.grpc = Field(*line, "grpc");
  master.http = Field(*line, "http");
  master.embedded_segment = Field(*line, "embedded_segment");
  if (std::string shm = Field(*line, "embedded_shm"); !shm.empty() && shm != "none") {
    master.embedded_shm_socket = FileRemover(shm);
  }
  return master;
}

absl::StatusOr<SegmentProcess> StartSegment(const std::string& master, const std::string& size,
                                            const std::vector<std::string>& extra_args,
                                            const Host& host) {
  std::vector<std::string> args = {"--master=" + master, "--size=" + size,
                                   "--listen=" + host.address + ":0",
                                   "--http-listen=" + host.address + ":0", "--prefault=false"};
  args.insert(args.end(), extra_args.begin(), extra_args.end());
  absl::StatusOr<std::unique_ptr<Process>> process = StartOn(host, SegmentBinary(), args);
  if (!process.ok()) return process.status();
  absl::StatusOr<std::string> line =
      (*process)->WaitForLine("kvpool-segment listening", kStartTimeout);
  if (!line.ok()) return line.status();
  SegmentProcess segment;
  segment.name = Field(*line, "name");
  segment.data = Field(*line, "data");
  segment.http = Field(*line, "http");
  segment.shm = Field(*line, "shm");
  if (std::string shm = Field(*line, "shm"); shm != "none") segment.shm_socket = FileRemover(shm);
  absl::StatusOr<std::string> mounted =
      (*process)->WaitForLine("kvpool-segment mounted", kStartTimeout);
  if (!mounted.ok()) return mounted.status();
  segment.process = std::move(*process);
  return segment;
}

}  // namespace kvpool::testing
