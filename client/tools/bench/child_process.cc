#include "client/tools/bench/child_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace kvpool::bench {
namespace {

bool IsExecutable(const std::string& path) {
  struct stat info;
  return stat(path.c_str(), &info) == 0 && S_ISREG(info.st_mode) && access(path.c_str(), X_OK) == 0;
}

std::string ReadFile(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  std::ostringstream text;
  text << file.rdbuf();
  return text.str();
}

}  // namespace

MemoryUse ReadMemoryUse(pid_t pid) {
  std::string path = pid == 0 ? "/proc/self/status" : absl::StrCat("/proc/", pid, "/status");
  MemoryUse use;
  std::ifstream file(path);
  std::string line;
  while (std::getline(file, line)) {
    uint64_t* field = absl::StartsWith(line, "VmRSS:")      ? &use.rss_bytes
                      : absl::StartsWith(line, "VmHWM:")    ? &use.peak_bytes
                      : absl::StartsWith(line, "RssAnon:")  ? &use.anon_bytes
                      : absl::StartsWith(line, "RssShmem:") ? &use.shmem_bytes
                                                            : nullptr;
    if (field == nullptr) continue;
    std::vector<absl::string_view> words =
        absl::StrSplit(line, ' ', absl::SkipEmpty());  // "VmRSS:", "1234", "kB"
    uint64_t kib = 0;
    if (words.size() >= 2 && absl::SimpleAtoi(words[1], &kib)) *field = kib * 1024;
  }
  return use;
}

bool ResetPeakMemory() {
  int fd = open("/proc/self/clear_refs", O_WRONLY | O_CLOEXEC);
  if (fd < 0) return false;
  bool ok = write(fd, "5", 1) == 1;
  close(fd);
  return ok;
}

absl::StatusOr<std::unique_ptr<ChildProcess>> ChildProcess::Start(
    std::string name, const std::string& binary, const std::vector<std::string>& args,
    std::string log_path) {
  if (!IsExecutable(binary)) {
    return absl::NotFoundError(absl::StrCat("no executable ", binary));
  }
  int log = open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (log < 0) {
    return absl::InternalError(
        absl::StrCat("cannot create ", log_path, ": ", std::strerror(errno)));
  }
  // Everything the child needs is prepared before fork: after it, only exec-safe calls.
  std::vector<std::string> words = {binary};
  words.insert(words.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& word : words) argv.push_back(word.data());
  argv.push_back(nullptr);
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) {
    close(log);
    return absl::InternalError(absl::StrCat("fork: ", std::strerror(errno)));
  }
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    dup2(log, STDOUT_FILENO);
    dup2(log, STDERR_FILENO);
    int null = open("/dev/null", O_RDONLY);
    if (null >= 0) dup2(null, STDIN_FILENO);
    // The bench blocks nothing, but reset what a child inherits anyway.
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(log);
  return std::unique_ptr<ChildProcess>(new ChildProcess(std::move(name), pid, std::move(log_path)));
}

ChildProcess::~ChildProcess() { Stop(); }

bool ChildProcess::Exited() {
  if (reaped_) return true;
  int status = 0;
  if (waitpid(pid_, &status, WNOHANG) == pid_) reaped_ = true;
  return reaped_;
}

void ChildProcess::Terminate() {
  if (!Exited()) kill(pid_, SIGTERM);
}

void ChildProcess::Stop(absl::Duration grace) {
  if (Exited()) return;
  kill(pid_, SIGTERM);
  absl::Time deadline = absl::Now() + grace;
  while (absl::Now() < deadline) {
    if (Exited()) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  kill(pid_, SIGKILL);
  int status = 0;
  waitpid(pid_, &status, 0);
  reaped_ = true;
}

std::string ChildProcess::LogTail() const {
  std::string text = ReadFile(log_path_);
  std::vector<std::string> lines = absl::StrSplit(text, '\n', absl::SkipEmpty());
  size_t first = lines.size() > 10 ? lines.size() - 10 : 0;
  std::string tail;
  for (size_t i = first; i < lines.size(); ++i) absl::StrAppend(&tail, "\n  | ", lines[i]);
  return tail;
}

absl::StatusOr<std::string> ChildProcess::WaitForLine(absl::string_view prefix,
                                                      absl::Duration timeout) {
  absl::Time deadline = absl::Now() + timeout;
  while (true) {
    // Complete lines only: the last one may still be being written.
    std::string text = ReadFile(log_path_);
    size_t start = 0;
    for (size_t end = text.find('\n'); end != std::string::npos; end = text.find('\n', start)) {
      absl::string_view line(text.data() + start, end - start);
      if (absl::StartsWith(line, prefix)) return std::string(line);
      start = end + 1;
    }
    if (Exited()) {
      return absl::UnavailableError(
          absl::StrCat(name_, " exited before it was ready (log ", log_path_, "):", LogTail()));
    }
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat(name_, " not ready after ",
                                                      absl::FormatDuration(timeout), " (log ",
                                                      log_path_, "):", LogTail()));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

std::string ExecutableDir() {
  char path[4096];
  ssize_t n = readlink("/proc/self/exe", path, sizeof(path) - 1);
  if (n <= 0) return "";
  std::string exe(path, static_cast<size_t>(n));
  size_t slash = exe.rfind('/');
  return slash == std::string::npos ? "" : exe.substr(0, slash);
}

absl::StatusOr<std::string> FindBinary(const std::string& flag_value,
                                       const std::vector<std::string>& candidates) {
  if (!flag_value.empty()) {
    if (IsExecutable(flag_value)) return flag_value;
    return absl::NotFoundError(absl::StrCat("no executable ", flag_value));
  }
  std::string dir = ExecutableDir();
  for (const std::string& candidate : candidates) {
    if (candidate.find('/') != std::string::npos) {
      std::string path = absl::StrCat(dir, "/", candidate);
      if (IsExecutable(path)) return path;
      continue;
    }
    std::string here = absl::StrCat(dir, "/", candidate);
    if (IsExecutable(here)) return here;
    const char* env_path = std::getenv("PATH");
    for (absl::string_view entry :
         absl::StrSplit(env_path ? env_path : "", ':', absl::SkipEmpty())) {
      std::string path = absl::StrCat(entry, "/", candidate);
      if (IsExecutable(path)) return path;
    }
  }
  return absl::NotFoundError(absl::StrCat("cannot find ",
                                          candidates.empty() ? "" : candidates.back(), " next to ",
                                          dir, " or in PATH"));
}

}  // namespace kvpool::bench
