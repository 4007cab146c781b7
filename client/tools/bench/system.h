#pragma once

// What the bench measures (a Workload) and on what (a System: kvpool itself, or one of the
// baselines it is compared with: raw loopback TCP, memcpy, Redis). Every system runs the same
// workload with the same value size, batch size and concurrency, so the ratios mean something.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/tools/bench/runner.h"

namespace kvpool::bench {

enum class WorkloadKind {
  kGet,        // read `batch_size` stored values per call
  kPut,        // write `batch_size` new values per call
  kMixed,      // each call a get (with probability read_fraction) or a put
  kMetaPut,    // master only: reserve `batch_size` keys (BatchPutStart), then revoke them
  kMetaExist,  // master only: BatchExist of `batch_size` stored keys
  kMetaLocal,  // master only: BatchGetLocal of `batch_size` stored keys (a mover's lookup)
};

std::string WorkloadName(WorkloadKind kind);
// The meta-* workloads: calls to the master only, no values move.
bool IsMetaWorkload(WorkloadKind kind);

struct Workload {
  WorkloadKind kind = WorkloadKind::kGet;
  uint64_t value_size = 512 << 10;
  int batch_size = 32;
  // Client threads; each runs one call at a time.
  int threads = 1;
  // Connections each client thread's batch is spread over (kvpool opens this many per batch;
  // the socket baselines open as many, each with its own thread).
  int lanes = 2;
  double read_fraction = 0.5;
  // Stored values that gets read (the working set), chosen at random per call.
  uint64_t keys = 1024;
  // Client-side memory per thread that values come from and go to, rotated through so that
  // caches do not flatter anyone (at least one batch).
  uint64_t client_buffer_bytes = 64 << 20;
  // Distinguishes this run's keys from any other's in a shared pool or Redis.
  std::string run_id;
};

class System {
 public:
  virtual ~System() = default;
  // "kvpool", "tcp", "memcpy", "redis".
  virtual std::string name() const = 0;
  // How it ran the workload, for the table: "tcp transport, shared client", "4 connections"
  // (asked after the run, so it may say what actually happened).
  virtual std::string Describe(const Workload& workload) const = 0;
  // Whether the system has a counterpart of the workload at all (memcpy has no key lookups).
  virtual bool Supports(WorkloadKind kind) const = 0;
  // Untimed set-up before a run: stores the values gets read, allocates buffers.
  virtual absl::Status Prepare(const Workload& workload) { return absl::OkStatus(); }
  // One worker per client thread (or connection) of the run.
  virtual absl::StatusOr<std::vector<std::unique_ptr<Worker>>> MakeWorkers(
      const Workload& workload) = 0;
  // Untimed clean-up after a run (removes what a put wrote, frees buffers).
  virtual void Finish(const Workload& workload) {}
};

}  // namespace kvpool::bench
