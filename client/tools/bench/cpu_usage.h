#pragma once

// How busy the machine was during a run, and with what: this process and the servers it
// started, or other processes (another engineer's build, say), so that a table measured on a
// shared machine says how quiet it was. From /proc, in clock ticks.

#include <sys/types.h>

#include <cstdint>
#include <vector>

namespace kvpool::bench {

struct CpuSample {
  // Machine-wide (/proc/stat): user, nice and system time; stolen by the hypervisor; all.
  uint64_t machine_busy = 0;
  uint64_t machine_steal = 0;
  uint64_t machine_total = 0;
  // User and system time of this process and of `pids`.
  uint64_t ours = 0;
};

CpuSample SampleCpu(const std::vector<pid_t>& pids);

struct CpuShare {
  // Fractions of the machine's CPU time between two samples (0..1).
  double ours = 0;
  double others = 0;
  double steal = 0;
};

CpuShare Between(const CpuSample& before, const CpuSample& after);

}  // namespace kvpool::bench
