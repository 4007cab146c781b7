#include "engine_plugin/testing/fake_store.h"

#include <cstring>

namespace kvpool::engine::testing {

std::vector<absl::StatusOr<bool>> FakeStore::BatchExist(absl::Span<const std::string> keys) {
  absl::MutexLock lock(&mu_);
  exist_keys_.emplace_back(keys.begin(), keys.end());
  std::vector<absl::StatusOr<bool>> results;
  for (const std::string& key : keys) {
    if (exist_failure_.has_value()) {
      results.push_back(*exist_failure_);
    } else {
      results.push_back(values_.contains(key));
    }
  }
  return results;
}

std::vector<absl::Status> FakeStore::BatchPut(absl::Span<const PutItem> items) {
  std::function<void()> hook;
  {
    absl::MutexLock lock(&mu_);
    hook = on_put_;
  }
  if (hook) hook();
  absl::MutexLock lock(&mu_);
  std::vector<std::string> keys;
  for (const PutItem& item : items) keys.push_back(item.key);
  put_keys_.push_back(keys);
  std::vector<absl::Status> script;
  if (!scripted_.empty()) {
    script = std::move(scripted_.front());
    scripted_.pop_front();
  }
  std::vector<absl::Status> results;
  for (size_t i = 0; i < items.size(); ++i) {
    absl::Status scripted = script.empty() ? absl::OkStatus()
                                           : script[std::min(i, script.size() - 1)];
    if (!scripted.ok()) {
      results.push_back(scripted);
      continue;
    }
    if (script.empty() && values_.contains(items[i].key)) {
      results.push_back(absl::AlreadyExistsError(items[i].key));
      continue;
    }
    std::string value;
    for (const ConstBuffer& part : items[i].parts) {
      value.append(static_cast<const char*>(part.data), part.size);
    }
    values_[items[i].key] = std::move(value);
    results.push_back(absl::OkStatus());
  }
  return results;
}

std::vector<absl::StatusOr<uint64_t>> FakeStore::BatchGet(absl::Span<const GetItem> items) {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> keys;
  for (const GetItem& item : items) keys.push_back(item.key);
  get_keys_.push_back(keys);
  std::vector<absl::StatusOr<uint64_t>> results;
  for (const GetItem& item : items) {
    auto it = values_.find(item.key);
    if (it == values_.end()) {
      results.push_back(absl::NotFoundError(item.key));
      continue;
    }
    const std::string& value = it->second;
    uint64_t capacity = 0;
    for (const MutableBuffer& part : item.parts) capacity += part.size;
    if (capacity < value.size()) {
      results.push_back(absl::OutOfRangeError("buffers too small"));
      continue;
    }
    size_t offset = 0;
    for (const MutableBuffer& part : item.parts) {
      size_t n = std::min(part.size, value.size() - offset);
      std::memcpy(part.data, value.data() + offset, n);
      offset += n;
    }
    results.push_back(value.size());
  }
  return results;
}

absl::Status FakeStore::RegisterBuffer(uint64_t base, uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  registered_.emplace_back(base, bytes);
  return absl::OkStatus();
}

void FakeStore::ScriptPut(std::vector<absl::Status> statuses) {
  absl::MutexLock lock(&mu_);
  scripted_.push_back(std::move(statuses));
}

void FakeStore::FailExist(absl::Status status) {
  absl::MutexLock lock(&mu_);
  exist_failure_ = std::move(status);
}

void FakeStore::Set(const std::string& key, std::string value) {
  absl::MutexLock lock(&mu_);
  values_[key] = std::move(value);
}

std::optional<std::string> FakeStore::Value(const std::string& key) const {
  absl::MutexLock lock(&mu_);
  auto it = values_.find(key);
  if (it == values_.end()) return std::nullopt;
  return it->second;
}

int FakeStore::exist_calls() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(exist_keys_.size());
}

int FakeStore::put_calls() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(put_keys_.size());
}

int FakeStore::get_calls() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(get_keys_.size());
}

std::vector<std::vector<std::string>> FakeStore::exist_keys() const {
  absl::MutexLock lock(&mu_);
  return exist_keys_;
}

std::vector<std::vector<std::string>> FakeStore::put_keys() const {
  absl::MutexLock lock(&mu_);
  return put_keys_;
}

std::vector<std::vector<std::string>> FakeStore::get_keys() const {
  absl::MutexLock lock(&mu_);
  return get_keys_;
}

std::vector<std::pair<uint64_t, uint64_t>> FakeStore::registered() const {
  absl::MutexLock lock(&mu_);
  return registered_;
}

void FakeStore::OnPut(std::function<void()> hook) {
  absl::MutexLock lock(&mu_);
  on_put_ = std::move(hook);
}

}  // namespace kvpool::engine::testing
