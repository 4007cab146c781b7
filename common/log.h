#pragma once

// Minimal leveled logging to stderr: "I1130 10:02:03.123456 4242 file.cc:42] message".
// KVPOOL_LOG(INFO) << ...; levels DEBUG, INFO, WARNING, ERROR, FATAL (aborts).
// The threshold comes from the KVPOOL_LOG_LEVEL environment variable (default INFO).
// KVPOOL_CHECK is for broken invariants only, never for input from a socket or a file.

#include <sstream>

namespace kvpool {

enum class LogLevel { kDEBUG = 0, kINFO = 1, kWARNING = 2, kERROR = 3, kFATAL = 4 };

bool LogEnabled(LogLevel level);

class LogMessage {
 public:
  LogMessage(LogLevel level, const char* file, int line);
  ~LogMessage();
  LogMessage(const LogMessage&) = delete;
  LogMessage& operator=(const LogMessage&) = delete;
  std::ostream& stream() { return stream_; }

 private:
  LogLevel level_;
  std::ostringstream stream_;
};

// Swallows a stream expression when a log level is disabled.
struct LogVoidify {
  void operator&(std::ostream&) {}
};

}  // namespace kvpool

#define KVPOOL_LOG(level)                                                   \
  !::kvpool::LogEnabled(::kvpool::LogLevel::k##level)                       \
      ? (void)0                                                             \
      : ::kvpool::LogVoidify() &                                            \
            ::kvpool::LogMessage(::kvpool::LogLevel::k##level, __FILE__, __LINE__).stream()

#define KVPOOL_CHECK(condition)                                                     \
  (condition) ? (void)0                                                             \
              : ::kvpool::LogVoidify() &                                            \
                    ::kvpool::LogMessage(::kvpool::LogLevel::kFATAL, __FILE__, __LINE__) \
                            .stream()                                               \
                        << "Check failed: " #condition " "
