#include "client/tools/bench/local_pool.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace kvpool::bench {
namespace {

// Touching a large pool takes a while on a slow machine.
constexpr absl::Duration kStartTimeout = absl::Seconds(120);

// The value of `key` in a line of "key=value" words ("" if absent).
std::string Field(absl::string_view line, absl::string_view key) {
  for (absl::string_view word : absl::StrSplit(line, ' ', absl::SkipEmpty())) {
    if (word.size() > key.size() && word.substr(0, key.size()) == key && word[key.size()] == '=') {
      return std::string(word.substr(key.size() + 1));
    }
  }
  return "";
}

}  // namespace

absl::StatusOr<LocalPool> StartLocalPool(const LocalPoolOptions& options) {
  LocalPool pool;
  uint64_t embedded = options.segments == 0 ? options.pool_bytes : 0;
  std::vector<std::string> args = {"--listen=127.0.0.1:0",
                                   "--http-listen=127.0.0.1:0",
                                   "--embedded-segment-listen=127.0.0.1:0",
                                   absl::StrCat("--embedded-segment-size=", embedded),
                                   absl::StrCat("--data-threads=", options.server_threads),
                                   "--prefault=true"};
  args.insert(args.end(), options.master_args.begin(), options.master_args.end());
  absl::StatusOr<std::unique_ptr<ChildProcess>> master = ChildProcess::Start(
      "kvpool-master", options.master_binary, args, options.log_dir + "/kvpool-master.log");
  if (!master.ok()) return master.status();
  absl::StatusOr<std::string> line =
      (*master)->WaitForLine("kvpool-master listening", kStartTimeout);
  if (!line.ok()) return line.status();
  pool.master = Field(*line, "grpc");
  pool.processes.push_back(std::move(*master));

  for (int i = 0; i < options.segments; ++i) {
    std::vector<std::string> segment_args = {
        absl::StrCat("--master=", pool.master),
        absl::StrCat("--size=", options.pool_bytes / options.segments),
        "--listen=127.0.0.1:0",
        "--http-listen=127.0.0.1:0",
        absl::StrCat("--threads=", options.server_threads),
        "--prefault=true"};
    segment_args.insert(segment_args.end(), options.segment_args.begin(),
                        options.segment_args.end());
    absl::StatusOr<std::unique_ptr<ChildProcess>> segment = ChildProcess::Start(
        absl::StrCat("kvpool-segment-", i), options.segment_binary, segment_args,
        absl::StrCat(options.log_dir, "/kvpool-segment-", i, ".log"));
    if (!segment.ok()) return segment.status();
    pool.processes.push_back(std::move(*segment));
  }
  // The segments touch their pools in parallel; wait for each to mount.
  for (size_t i = 1; i < pool.processes.size(); ++i) {
    absl::StatusOr<std::string> mounted =
        pool.processes[i]->WaitForLine("kvpool-segment mounted", kStartTimeout);
    if (!mounted.ok()) return mounted.status();
  }
  return pool;
}

}  // namespace kvpool::bench
