#pragma once

// An in-memory StoreBackend for unit tests: keeps values in a map, copying bytes out of and
// into the callers' buffers like the real store, records every call, and can be scripted to
// answer a put batch with given statuses (NO_AVAILABLE_HANDLE, transfer failures, ...).
// Thread-safe.

#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "engine_plugin/store_backend.h"

namespace kvpool::engine::testing {

class FakeStore : public StoreBackend {
 public:
  std::vector<absl::StatusOr<bool>> BatchExist(absl::Span<const std::string> keys) override
      ABSL_LOCKS_EXCLUDED(mu_);
  // Uses the next scripted answer if there is one (OK entries store the value), else stores
  // every value (AlreadyExists for keys already present).
  std::vector<absl::Status> BatchPut(absl::Span<const PutItem> items) override
      ABSL_LOCKS_EXCLUDED(mu_);
  std::vector<absl::StatusOr<uint64_t>> BatchGet(absl::Span<const GetItem> items) override
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status RegisterBuffer(uint64_t base, uint64_t bytes) override ABSL_LOCKS_EXCLUDED(mu_);

  // The answer to the next BatchPut (one status per key; the last one repeats if short).
  void ScriptPut(std::vector<absl::Status> statuses) ABSL_LOCKS_EXCLUDED(mu_);
  // Every BatchExist answers this status for every key instead of looking.
  void FailExist(absl::Status status) ABSL_LOCKS_EXCLUDED(mu_);
  void Set(const std::string& key, std::string value) ABSL_LOCKS_EXCLUDED(mu_);
  std::optional<std::string> Value(const std::string& key) const ABSL_LOCKS_EXCLUDED(mu_);

  int exist_calls() const ABSL_LOCKS_EXCLUDED(mu_);
  int put_calls() const ABSL_LOCKS_EXCLUDED(mu_);
  int get_calls() const ABSL_LOCKS_EXCLUDED(mu_);
  // Keys of every BatchExist / BatchPut / BatchGet call, in call order.
  std::vector<std::vector<std::string>> exist_keys() const ABSL_LOCKS_EXCLUDED(mu_);
  std::vector<std::vector<std::string>> put_keys() const ABSL_LOCKS_EXCLUDED(mu_);
  std::vector<std::vector<std::string>> get_keys() const ABSL_LOCKS_EXCLUDED(mu_);
  std::vector<std::pair<uint64_t, uint64_t>> registered() const ABSL_LOCKS_EXCLUDED(mu_);
  // Called at the start of every BatchPut (before scripted answers), e.g. to check ordering.
  void OnPut(std::function<void()> hook) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  mutable absl::Mutex mu_;
  std::map<std::string, std::string> values_ ABSL_GUARDED_BY(mu_);
  std::deque<std::vector<absl::Status>> scripted_ ABSL_GUARDED_BY(mu_);
  std::optional<absl::Status> exist_failure_ ABSL_GUARDED_BY(mu_);
  std::vector<std::vector<std::string>> exist_keys_ ABSL_GUARDED_BY(mu_);
  std::vector<std::vector<std::string>> put_keys_ ABSL_GUARDED_BY(mu_);
  std::vector<std::vector<std::string>> get_keys_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<uint64_t, uint64_t>> registered_ ABSL_GUARDED_BY(mu_);
  std::function<void()> on_put_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvpool::engine::testing
