#pragma once

// The memcpy ceiling: one thread copying the same values, `batch_size` per call, from a
// source region into a destination region each of half of `working_set_bytes` (far larger
// than the last-level cache, as the pool is), one memcpy per value. What a same-host
// transport (shared memory) can at best do per client thread; gets and puts are the same copy.

#include "client/tools/bench/io.h"
#include "client/tools/bench/system.h"

namespace kvpool::bench {

class MemcpyBaseline : public System {
 public:
  explicit MemcpyBaseline(uint64_t working_set_bytes) : working_set_bytes_(working_set_bytes) {}

  std::string name() const override { return "memcpy"; }
  std::string Describe(const Workload& workload) const override;
  bool Supports(WorkloadKind kind) const override;
  // Allocates and touches the two regions.
  absl::Status Prepare(const Workload& workload) override;
  absl::StatusOr<std::vector<std::unique_ptr<Worker>>> MakeWorkers(
      const Workload& workload) override;
  // Frees them.
  void Finish(const Workload& workload) override;

 private:
  const uint64_t working_set_bytes_;
  Buffer source_;
  Buffer destination_;
};

}  // namespace kvpool::bench
