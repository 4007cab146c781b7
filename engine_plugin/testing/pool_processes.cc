#include "engine_plugin/testing/pool_processes.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace kvpool::engine::testing {

absl::StatusOr<MasterProcess> StartMaster(const std::string& binary,
                                          const std::string& embedded_segment_size,
                                          const std::vector<std::string>& extra_flags) {
  std::vector<std::string> args = {"--listen=127.0.0.1:0", "--http-listen=127.0.0.1:0",
                                   absl::StrCat("--embedded-segment-size=", embedded_segment_size),
                                   "--prefault=false"};
  args.insert(args.end(), extra_flags.begin(), extra_flags.end());
  absl::StatusOr<std::unique_ptr<ChildProcess>> process = ChildProcess::Spawn(binary, args);
  if (!process.ok()) return process.status();
  absl::StatusOr<std::string> line =
      (*process)->WaitForLine("kvpool-master listening", absl::Seconds(30));
  if (!line.ok()) return line.status();
  MasterProcess master;
  master.process = std::move(*process);
  master.grpc_address = FieldOf(*line, "grpc");
  master.http_address = FieldOf(*line, "http");
  master.embedded_segment = FieldOf(*line, "embedded_segment");
  if (!absl::SimpleAtoi(FieldOf(*line, "embedded_size"), &master.embedded_size)) {
    master.embedded_size = 0;
  }
  if (master.grpc_address.empty()) {
    return absl::InternalError(absl::StrCat("unexpected master line: ", *line));
  }
  return master;
}

absl::StatusOr<SegmentProcess> StartSegment(const std::string& binary,
                                            const std::string& master_address,
                                            const std::string& size,
                                            const std::vector<std::string>& extra_flags) {
  std::vector<std::string> args = {absl::StrCat("--master=", master_address),
                                   absl::StrCat("--size=", size), "--listen=127.0.0.1:0",
                                   "--http-listen=127.0.0.1:0", "--prefault=false"};
  args.insert(args.end(), extra_flags.begin(), extra_flags.end());
  absl::StatusOr<std::unique_ptr<ChildProcess>> process = ChildProcess::Spawn(binary, args);
  if (!process.ok()) return process.status();
  absl::StatusOr<std::string> line =
      (*process)->WaitForLine("kvpool-segment listening", absl::Seconds(30));
  if (!line.ok()) return line.status();
  SegmentProcess segment;
  segment.name = FieldOf(*line, "name");
  segment.data_address = FieldOf(*line, "data");
  segment.http_address = FieldOf(*line, "http");
  absl::StatusOr<std::string> mounted =
      (*process)->WaitForLine("kvpool-segment mounted", absl::Seconds(30));
  if (!mounted.ok()) return mounted.status();
  segment.process = std::move(*process);
  return segment;
}

}  // namespace kvpool::engine::testing
