#pragma once

// Runs one workload on one system: a set of Workers, one thread each, for a duration or a
// number of iterations after a warm-up, with a progress line on stderr. Each call of
// Worker::RunOnce is one timed operation (a batch); its latency goes into a Histogram.

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "client/tools/bench/histogram.h"

namespace kvpool::bench {

// What one call of Worker::RunOnce did.
struct OpResult {
  // Values (or keys, for the master's key operations) handled, and their payload bytes.
  uint64_t ops = 0;
  uint64_t bytes = 0;
  // Values that failed; `error` says why (the first such reason is kept).
  uint64_t errors = 0;
  std::string error;
};

// One client thread of a system. Created and destroyed on the main thread; RunOnce runs on
// the worker's own thread, one call at a time.
class Worker {
 public:
  virtual ~Worker() = default;
  virtual OpResult RunOnce() = 0;
};

enum class ProgressMode { kAuto, kOn, kOff };

struct RunOptions {
  // Shown in the progress line, e.g. "get kvpool".
  std::string label;
  // Untimed calls before measuring (0: none).
  absl::Duration warmup = absl::Seconds(1);
  // Measure for this long, or, when `iterations` is above 0, until every worker has made
  // that many measured calls.
  absl::Duration duration = absl::Seconds(10);
  uint64_t iterations = 0;
  // kAuto: a line rewritten in place once a second when stderr is a terminal.
  ProgressMode progress = ProgressMode::kAuto;
};

struct RunStats {
  uint64_t calls = 0;
  uint64_t ops = 0;
  uint64_t bytes = 0;
  uint64_t errors = 0;
  std::string first_error;
  // From the start of measurement to the end of the last measured call.
  double seconds = 0;
  // Latency of each call (batch), in nanoseconds.
  Histogram latency;
};

RunStats RunWorkers(const std::vector<std::unique_ptr<Worker>>& workers, const RunOptions& options);

// SIGINT and SIGTERM end the current run early (its results still count) and skip the rest;
// a second signal exits at once.
void InstallInterruptHandler();
bool Interrupted();

}  // namespace kvpool::bench
