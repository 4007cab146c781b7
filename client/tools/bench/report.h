#pragma once

// The bench's results: a table per workload for people (throughput, latency percentiles and
// kvpool's ratio to every baseline), or one JSON document for scripts.

#include <string>
#include <vector>

#include "client/tools/bench/child_process.h"
#include "client/tools/bench/cpu_usage.h"
#include "client/tools/bench/runner.h"
#include "client/tools/bench/system.h"

namespace kvpool::bench {

// One system's run of one workload.
struct Result {
  Workload workload;
  std::string system;
  std::string detail;
  RunStats stats;
  // Set when the system could not run it (set-up failed); stats are then empty.
  std::string failure;
  // This process's resident memory just before and after the run, and its peak during it
  // (kvpool runs only: the client's footprint).
  MemoryUse memory_before;
  MemoryUse memory_after;
  uint64_t peak_bytes = 0;
  // Who used the machine's CPUs while it was measured.
  CpuShare cpu;
  // --quiet-below: the machine did not become quiet before the run started.
  bool noisy = false;
};

// kvpool's throughput and p50 latency over a baseline's, in one workload.
struct Ratio {
  std::string workload;
  std::string baseline;
  // kvpool / baseline, of bytes per second (ops per second where the baseline moves no
  // bytes); 0 if either is missing. Above 1: kvpool moved more.
  double throughput = 0;
  // kvpool p50 / baseline p50. Below 1: kvpool answered faster.
  double p50_latency = 0;
};

struct ServerMemory {
  std::string name;
  int pid = 0;
  MemoryUse start;  // before the first run
  MemoryUse end;    // after the last
};

struct Report {
  // The command line and settings, for the JSON's "config" and the table's header.
  std::vector<std::pair<std::string, std::string>> config;
  std::vector<Result> results;
  std::vector<ServerMemory> servers;
  MemoryUse client_start;  // before the first measured run
  MemoryUse client_end;    // after the last
  // The most this process ever had resident (VmHWM over every run: each run resets it, which
  // resets getrusage's ru_maxrss too), baselines' buffers included.
  uint64_t client_peak_bytes = 0;
  std::vector<std::string> notes;
};

std::vector<Ratio> ComputeRatios(const std::vector<Result>& results);
std::string FormatTable(const Report& report);
std::string FormatJson(const Report& report);

}  // namespace kvpool::bench
