#pragma once

// Starts a real program for an integration test and watches its standard output line by
// line; stderr is inherited, so a failing test shows the servers' logs. The destructor kills
// the process (SIGKILL) and reaps it, so a test never leaves a server behind.

#include <sys/types.h>

#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace kvpool::testing {

class Process {
 public:
  // NotFound if the binary does not exist; Internal if it cannot be started.
  static absl::StatusOr<std::unique_ptr<Process>> Start(const std::string& binary,
                                                        const std::vector<std::string>& args);
  ~Process();

  // The first line not returned before that starts with `prefix` (lines that match nothing
  // are kept for later waits). DeadlineExceeded after `timeout`; Unavailable if the process
  // closed its output (exited) first.
  absl::StatusOr<std::string> WaitForLine(absl::string_view prefix, absl::Duration timeout)
      ABSL_LOCKS_EXCLUDED(mu_);

  // SIGSTOP returns once every thread of the process is stopped (at most 5 s).
  void Signal(int signal_number);
  // Waits for the process to exit and returns its wait status (see waitpid).
  int Wait();
  pid_t pid() const { return pid_; }

 private:
  Process(pid_t pid, int stdout_fd);
  void ReadLines() ABSL_LOCKS_EXCLUDED(mu_);

  const pid_t pid_;
  const int stdout_fd_;
  bool reaped_ = false;
  int wait_status_ = 0;
  absl::Mutex mu_;
  std::deque<std::string> lines_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  std::thread reader_;
};

// Where a test starts a server: this machine's loopback (the default), or a simulated host of
// a VirtualNetwork (tests/harness/netns.h), whose namespace `launcher` enters before the
// binary runs.
struct Host {
  std::string address = "127.0.0.1";  // the host's own address: servers listen here
  std::vector<std::string> launcher;  // prefix of the command line; empty: none
};

// Process::Start of `binary` with `args` on `host` (through its launcher, which execs the
// binary in place: the pid, signals and the death signal are the binary's own).
absl::StatusOr<std::unique_ptr<Process>> StartOn(const Host& host, const std::string& binary,
                                                 const std::vector<std::string>& args);

// The value of `key` in a line of "key=value" words ("" if absent).
std::string Field(absl::string_view line, absl::string_view key);

}  // namespace kvpool::testing
