#include "common/log.h"

#include <sys/time.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include "absl/strings/string_view.h"

namespace kvpool {
namespace {

LogLevel ThresholdFromEnv() {
  const char* env = std::getenv("KVPOOL_LOG_LEVEL");
  if (env == nullptr) return LogLevel::kINFO;
  absl::string_view value(env);
  if (value == "DEBUG" || value == "debug") return LogLevel::kDEBUG;
  if (value == "WARNING" || value == "warning") return LogLevel::kWARNING;
  if (value == "ERROR" || value == "error") return LogLevel::kERROR;
  return LogLevel::kINFO;
}

const LogLevel kThreshold = ThresholdFromEnv();

}  // namespace

bool LogEnabled(LogLevel level) { return level >= kThreshold; }

LogMessage::LogMessage(LogLevel level, const char* file, int line) : level_(level) {
  static constexpr char kLetters[] = "DIWEF";
  timeval now;
  gettimeofday(&now, nullptr);
  tm local;
  localtime_r(&now.tv_sec, &local);
  const char* base = std::strrchr(file, '/');
  char prefix[96];
  std::snprintf(prefix, sizeof(prefix), "%c%02d%02d %02d:%02d:%02d.%06ld %d %s:%d] ",
                kLetters[static_cast<int>(level)], local.tm_mon + 1, local.tm_mday, local.tm_hour,
                local.tm_min, local.tm_sec, static_cast<long>(now.tv_usec),
                static_cast<int>(getpid()), base ? base + 1 : file, line);
  stream_ << prefix;
}

LogMessage::~LogMessage() {
  stream_ << '\n';
  std::string text = stream_.str();
  // One write per message, so lines of concurrent threads do not interleave.
  ssize_t ignored = ::write(STDERR_FILENO, text.data(), text.size());
  (void)ignored;
  if (level_ == LogLevel::kFATAL) std::abort();
}

}  // namespace kvpool
