#include "client/tools/bench/runner.h"

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <thread>

namespace kvpool::bench {
namespace {

std::atomic<bool> interrupted{false};

void OnSignal(int signal_number) {
  if (interrupted.exchange(true)) {
    // A second signal: give up at once (started servers die with us: PR_SET_PDEATHSIG).
    signal(signal_number, SIG_DFL);
    raise(signal_number);
  }
}

enum Phase : int { kWarmup = 0, kMeasure = 1, kStop = 2 };

// What one worker thread counts; the counters are read by the progress line while it runs.
struct alignas(64) Slot {
  std::atomic<uint64_t> calls{0};
  std::atomic<uint64_t> ops{0};
  std::atomic<uint64_t> bytes{0};
  std::atomic<uint64_t> errors{0};
  // Written by the worker thread only; read after it has been joined.
  Histogram latency;
  std::string first_error;
  int64_t end_nanos = 0;
};

int64_t NowNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

void InstallInterruptHandler() {
  struct sigaction action {};
  action.sa_handler = OnSignal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
}

bool Interrupted() { return interrupted.load(std::memory_order_relaxed); }

RunStats RunWorkers(const std::vector<std::unique_ptr<Worker>>& workers,
                    const RunOptions& options) {
  const size_t n = workers.size();
  std::vector<Slot> slots(n);
  std::atomic<int> phase{options.warmup > absl::ZeroDuration() ? kWarmup : kMeasure};
  std::atomic<size_t> finished{0};

  std::vector<std::thread> threads;
  threads.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      Worker& worker = *workers[i];
      Slot& slot = slots[i];
      while (true) {
        int at_start = phase.load(std::memory_order_acquire);
        if (at_start == kStop) break;
        if (at_start == kMeasure && options.iterations > 0 &&
            slot.calls.load(std::memory_order_relaxed) >= options.iterations) {
          break;
        }
        int64_t started = NowNanos();
        OpResult result = worker.RunOnce();
        int64_t ended = NowNanos();
        if (at_start != kMeasure) continue;  // a warm-up call
        slot.latency.Record(static_cast<uint64_t>(ended - started));
        slot.end_nanos = ended;
        slot.ops.fetch_add(result.ops, std::memory_order_relaxed);
        slot.bytes.fetch_add(result.bytes, std::memory_order_relaxed);
        if (result.errors > 0) {
          slot.errors.fetch_add(result.errors, std::memory_order_relaxed);
          if (slot.first_error.empty()) slot.first_error = result.error;
        }
        slot.calls.fetch_add(1, std::memory_order_relaxed);
      }
      finished.fetch_add(1, std::memory_order_release);
    });
  }

  bool show = options.progress == ProgressMode::kOn ||
              (options.progress == ProgressMode::kAuto && isatty(STDERR_FILENO));
  auto sleep_until = [&](int64_t deadline) {
    while (NowNanos() < deadline && !Interrupted() &&
           finished.load(std::memory_order_acquire) < n) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  };

  if (phase.load() == kWarmup) {
    if (show) std::fprintf(stderr, "\r\033[K  %s: warming up", options.label.c_str());
    sleep_until(NowNanos() + absl::ToInt64Nanoseconds(options.warmup));
  }
  const int64_t measure_start = NowNanos();
  phase.store(kMeasure, std::memory_order_release);
  const int64_t measure_end = options.iterations > 0
                                  ? INT64_MAX
                                  : measure_start + absl::ToInt64Nanoseconds(options.duration);
  uint64_t last_bytes = 0, last_ops = 0;
  int64_t last_at = measure_start;
  while (NowNanos() < measure_end && !Interrupted() &&
         finished.load(std::memory_order_acquire) < n) {
    sleep_until(std::min(measure_end, last_at + 1'000'000'000));
    int64_t now = NowNanos();
    if (now - last_at < 1'000'000'000) continue;
    if (!show) {
      last_at = now;
      continue;
    }
    uint64_t bytes = 0, ops = 0, errors = 0;
    for (const Slot& slot : slots) {
      bytes += slot.bytes.load(std::memory_order_relaxed);
      ops += slot.ops.load(std::memory_order_relaxed);
      errors += slot.errors.load(std::memory_order_relaxed);
    }
    double dt = static_cast<double>(now - last_at) / 1e9;
    std::fprintf(stderr, "\r\033[K  %s: %.0fs  %.2f GB/s  %.0f ops/s  errors %llu",
                 options.label.c_str(), static_cast<double>(now - measure_start) / 1e9,
                 static_cast<double>(bytes - last_bytes) / dt / 1e9,
                 static_cast<double>(ops - last_ops) / dt, static_cast<unsigned long long>(errors));
    last_bytes = bytes;
    last_ops = ops;
    last_at = now;
  }
  phase.store(kStop, std::memory_order_release);
  for (std::thread& thread : threads) thread.join();
  if (show) std::fprintf(stderr, "\r\033[K");

  RunStats stats;
  int64_t end = measure_start;
  for (Slot& slot : slots) {
    stats.calls += slot.calls.load();
    stats.ops += slot.ops.load();
    stats.bytes += slot.bytes.load();
    stats.errors += slot.errors.load();
    if (stats.first_error.empty()) stats.first_error = slot.first_error;
    stats.latency.Merge(slot.latency);
    end = std::max(end, slot.end_nanos);
  }
  stats.seconds = static_cast<double>(end - measure_start) / 1e9;
  return stats;
}

}  // namespace kvpool::bench
