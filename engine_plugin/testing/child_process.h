#pragma once

// A child process for integration tests: started with fork/exec, its stdout read line by
// line (to wait for readiness lines instead of sleeping), stopped with SIGTERM (then SIGKILL)
// when the test is done. The child also gets SIGTERM if the test process dies.
// Thread-compatible: one thread drives a ChildProcess.

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace kvpool::engine::testing {

class ChildProcess {
 public:
  // Unavailable if the binary cannot be started.
  static absl::StatusOr<std::unique_ptr<ChildProcess>> Spawn(const std::string& binary,
                                                             const std::vector<std::string>& args);
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  // The next stdout line that starts with `prefix` (earlier lines are skipped).
  // DeadlineExceeded after `timeout`; Unavailable if the child closes its stdout (exits).
  absl::StatusOr<std::string> WaitForLine(absl::string_view prefix, absl::Duration timeout);

  // SIGTERM, then SIGKILL if it has not exited within `grace`. Safe to call twice.
  void Stop(absl::Duration grace = absl::Seconds(5));
  pid_t pid() const { return pid_; }

 private:
  ChildProcess(pid_t pid, int stdout_fd) : pid_(pid), stdout_fd_(stdout_fd) {}

  pid_t pid_;
  int stdout_fd_;
  std::string buffered_;
  bool exited_ = false;
};

// The value of "key=value" in a space-separated line, or "" if absent.
std::string FieldOf(absl::string_view line, absl::string_view key);

}  // namespace kvpool::engine::testing
