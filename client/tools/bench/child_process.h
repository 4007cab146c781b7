#pragma once

// Server processes the bench starts (kvpool-master, kvpool-segment, redis-server): output to
// a log file, readiness by a line in it, memory use from /proc, stopped by the destructor
// (SIGTERM, then SIGKILL), and killed by the kernel if the bench itself dies
// (PR_SET_PDEATHSIG), so no run leaves a server behind. Not thread-safe.

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace kvpool::bench {

struct MemoryUse {
  uint64_t rss_bytes = 0;   // VmRSS: resident now
  uint64_t peak_bytes = 0;  // VmHWM: the most ever resident (since the last reset)
  // Parts of rss_bytes: private memory (RssAnon), and shared memory (RssShmem: a kvpool
  // pool the process mapped, which the segment owns and counts too).
  uint64_t anon_bytes = 0;
  uint64_t shmem_bytes = 0;
};

// From /proc/PID/status (pid 0: this process); zeros if it cannot be read.
MemoryUse ReadMemoryUse(pid_t pid);
// Resets this process's VmHWM to its current RSS (Linux: /proc/self/clear_refs); false if the
// kernel does not allow it.
bool ResetPeakMemory();

class ChildProcess {
 public:
  // NotFound if `binary` is not an executable file; Internal if it cannot be started.
  static absl::StatusOr<std::unique_ptr<ChildProcess>> Start(std::string name,
                                                             const std::string& binary,
                                                             const std::vector<std::string>& args,
                                                             std::string log_path);
  ~ChildProcess();

  // The first line of the process's output that starts with `prefix`. DeadlineExceeded after
  // `timeout`; Unavailable (with the end of its log) if it exited first.
  absl::StatusOr<std::string> WaitForLine(absl::string_view prefix, absl::Duration timeout);
  // Asks it to stop (SIGTERM) without waiting, so that several stop at once.
  void Terminate();
  // SIGTERM, then SIGKILL after `grace`; reaps it. Safe to call twice.
  void Stop(absl::Duration grace = absl::Seconds(5));
  bool Exited();

  const std::string& name() const { return name_; }
  pid_t pid() const { return pid_; }
  const std::string& log_path() const { return log_path_; }
  // The last lines of its log, for error messages.
  std::string LogTail() const;

 private:
  ChildProcess(std::string name, pid_t pid, std::string log_path)
      : name_(std::move(name)), pid_(pid), log_path_(std::move(log_path)) {}

  const std::string name_;
  const pid_t pid_;
  const std::string log_path_;
  bool reaped_ = false;
};

// The directory of this executable ("" if unknown).
std::string ExecutableDir();

// `flag_value` if set; otherwise the first of `candidates` (paths relative to this
// executable's directory, then names looked up in PATH) that is an executable file.
absl::StatusOr<std::string> FindBinary(const std::string& flag_value,
                                       const std::vector<std::string>& candidates);

}  // namespace kvpool::bench
