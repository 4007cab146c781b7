#include "tests/harness/process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"

namespace kvpool::testing {

absl::StatusOr<std::unique_ptr<Process>> Process::Start(const std::string& binary,
                                                        const std::vector<std::string>& args) {
  struct stat info;
  if (stat(binary.c_str(), &info) != 0) return absl::NotFoundError(absl::StrCat("no ", binary));
  int pipe_fds[2];
  if (pipe2(pipe_fds, O_CLOEXEC) != 0) return absl::InternalError("pipe failed");
  std::vector<char*> argv;
  argv.push_back(const_cast<char*>(binary.c_str()));
  for (const std::string& arg : args) argv.push_back(const_cast<char*>(arg.c_str()));
  argv.push_back(nullptr);
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) {
    close(pipe_fds[0]);
    close(pipe_fds[1]);
    return absl::InternalError(absl::StrCat("cannot start ", binary, ": ", std::strerror(errno)));
  }
  if (pid == 0) {
    // The child dies with the test, however the test ends (a crash, a ctest timeout): no
    // server is ever left behind. Only async-signal-safe calls until exec.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    dup2(pipe_fds[1], STDOUT_FILENO);
    execv(binary.c_str(), argv.data());
    _exit(127);
  }
  close(pipe_fds[1]);
  return std::unique_ptr<Process>(new Process(pid, pipe_fds[0]));
}

Process::Process(pid_t pid, int stdout_fd) : pid_(pid), stdout_fd_(stdout_fd) {
  reader_ = std::thread([this] { ReadLines(); });
}

Process::~Process() {
  if (!reaped_) {
    kill(pid_, SIGKILL);
    Wait();
  }
  reader_.join();
  close(stdout_fd_);
}

void Process::ReadLines() {
  std::string pending;
  char buffer[4096];
  while (true) {
    ssize_t n = read(stdout_fd_, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    pending.append(buffer, static_cast<size_t>(n));
    size_t end;
    while ((end = pending.find('\n')) != std::string::npos) {
      absl::MutexLock lock(&mu_);
      lines_.push_back(pending.substr(0, end));
      pending.erase(0, end + 1);
    }
  }
  absl::MutexLock lock(&mu_);
  closed_ = true;
}

absl::StatusOr<std::string> Process::WaitForLine(absl::string_view prefix, absl::Duration timeout) {
  absl::Time deadline = absl::Now() + timeout;
  absl::MutexLock lock(&mu_);
  size_t seen = 0;
  while (true) {
    // Lines that do not match stay: a later wait may be for them (a segment can print that
    // it mounted before its "listening" line).
    for (auto it = lines_.begin(); it != lines_.end(); ++it) {
      if (absl::StartsWith(*it, prefix)) {
        std::string line = *it;
        lines_.erase(it);
        return line;
      }
    }
    if (closed_) {
      return absl::UnavailableError(absl::StrCat("process ", pid_, " exited before printing \"",
                                                 prefix, "\""));
    }
    seen = lines_.size();
    auto more = [this, seen]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return closed_ || lines_.size() > seen;
    };
    if (!mu_.AwaitWithDeadline(absl::Condition(&more), deadline)) {
      return absl::DeadlineExceededError(absl::StrCat(
          "no line \"", prefix, "\" within ", absl::FormatDuration(timeout)));
    }
  }
}

namespace {

// Whether every thread of `pid` is stopped (or gone): kill() returns once SIGSTOP is queued,
// and a thread running on another core goes on until it next enters the kernel.
bool AllThreadsStopped(pid_t pid) {
  std::error_code error;
  for (const auto& task :
       std::filesystem::directory_iterator(absl::StrCat("/proc/", pid, "/task"), error)) {
    std::ifstream stat(task.path() / "stat");
    std::string line;
    if (!std::getline(stat, line)) continue;  // the thread exited
    // The state follows the command name, which is in parentheses and may hold spaces.
    const size_t close = line.rfind(')');
    if (close == std::string::npos || close + 2 >= line.size()) continue;
    const char state = line[close + 2];
    if (state != 'T' && state != 't' && state != 'Z' && state != 'X') return false;
  }
  return true;
}

}  // namespace

void Process::Signal(int signal_number) {
  kill(pid_, signal_number);
  if (signal_number != SIGSTOP) return;
  // A test that stops a server expects it stopped when this returns, not a moment later.
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (!AllThreadsStopped(pid_) && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(1));
}

int Process::Wait() {
  if (!reaped_) {
    while (waitpid(pid_, &wait_status_, 0) < 0 && errno == EINTR) {
    }
    reaped_ = true;
  }
  return wait_status_;
}

absl::StatusOr<std::unique_ptr<Process>> StartOn(const Host& host, const std::string& binary,
                                                 const std::vector<std::string>& args) {
  if (host.launcher.empty()) return Process::Start(binary, args);
  struct stat info;
  if (stat(binary.c_str(), &info) != 0) return absl::NotFoundError(absl::StrCat("no ", binary));
  std::vector<std::string> command(host.launcher.begin() + 1, host.launcher.end());
  command.push_back(binary);
  command.insert(command.end(), args.begin(), args.end());
  return Process::Start(host.launcher.front(), command);
}

std::string Field(absl::string_view line, absl::string_view key) {
  for (absl::string_view word : absl::StrSplit(line, ' ')) {
    if (absl::StartsWith(word, key) && word.size() > key.size() && word[key.size()] == '=') {
      return std::string(word.substr(key.size() + 1));
    }
  }
  return "";
}

}  // namespace kvpool::testing
