#include "client/tools/bench/memcpy_baseline.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/size.h"

namespace kvpool::bench {
namespace {

class CopyWorker : public Worker {
 public:
  CopyWorker(const Buffer& source, const Buffer& destination, const Workload& workload)
      : source_(source.data()),
        destination_(destination.data()),
        value_size_(workload.value_size),
        batch_(workload.batch_size),
        slots_(std::max<uint64_t>(
            1, std::min(source.size(), destination.size()) / workload.value_size)),
        // Start the destination half-way round, so source and destination slots differ.
        next_destination_(slots_ / 2) {}

  OpResult RunOnce() override {
    for (int k = 0; k < batch_; ++k) {
      std::memcpy(destination_ + next_destination_ * value_size_,
                  source_ + next_source_ * value_size_, value_size_);
      next_source_ = (next_source_ + 1) % slots_;
      next_destination_ = (next_destination_ + 1) % slots_;
    }
    return OpResult{.ops = static_cast<uint64_t>(batch_),
                    .bytes = static_cast<uint64_t>(batch_) * value_size_};
  }

 private:
  const uint8_t* const source_;
  uint8_t* const destination_;
  const uint64_t value_size_;
  const int batch_;
  const uint64_t slots_;
  uint64_t next_source_ = 0;
  uint64_t next_destination_;
};

}  // namespace

std::string MemcpyBaseline::Describe(const Workload& workload) const {
  return absl::StrCat("1 thread, 2 x ",
                      FormatSize(std::max(working_set_bytes_ / 2, workload.value_size)));
}

bool MemcpyBaseline::Supports(WorkloadKind kind) const {
  return kind == WorkloadKind::kGet || kind == WorkloadKind::kPut || kind == WorkloadKind::kMixed;
}

absl::Status MemcpyBaseline::Prepare(const Workload& workload) {
  uint64_t half = std::max(working_set_bytes_ / 2, workload.value_size);
  source_ = Buffer(half, 0x11);
  destination_ = Buffer(half, 0x22);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::unique_ptr<Worker>>> MemcpyBaseline::MakeWorkers(
    const Workload& workload) {
  std::vector<std::unique_ptr<Worker>> workers;
  workers.push_back(std::make_unique<CopyWorker>(source_, destination_, workload));
  return workers;
}

void MemcpyBaseline::Finish(const Workload& workload) {
  source_ = Buffer();
  destination_ = Buffer();
}

}  // namespace kvpool::bench
