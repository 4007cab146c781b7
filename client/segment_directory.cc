#include "client/segment_directory.h"

#include <utility>

#include "proto/key_read.h"

namespace kvpool::client {

SegmentDirectory::SegmentDirectory(MasterClient& master, std::string machine_id,
                                   absl::Duration period)
    : master_(master),
      machine_id_(std::move(machine_id)),
      period_(period),
      snapshot_(std::make_shared<const Snapshot>()) {}

SegmentDirectory::~SegmentDirectory() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

absl::Status SegmentDirectory::Refresh() {
  absl::StatusOr<SegmentList> list = master_.ListSegments();
  if (!list.ok()) return list.status();
  auto snapshot = std::make_shared<Snapshot>();
  snapshot->tenant = list->tenant;
  for (SegmentEntry& segment : list->segments) {
    if (segment.machine_id == machine_id_) {
      snapshot->local[segment.endpoint] = segment.shm_socket;
    } else {
      snapshot->remote.insert(segment.endpoint);
    }
    if (segment.active) snapshot->active.push_back(std::move(segment));
  }
  absl::MutexLock lock(&mu_);
  snapshot_ = std::move(snapshot);
  ++refreshes_;
  return absl::OkStatus();
}

void SegmentDirectory::Start() {
  absl::MutexLock lock(&mu_);
  if (thread_.joinable() || stopping_) return;
  thread_ = std::thread([this] { Loop(); });
}

void SegmentDirectory::Loop() {
  absl::Time next = absl::Now() + period_;
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      auto due = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || wanted_; };
      mu_.AwaitWithDeadline(absl::Condition(&due), next);
      if (stopping_) return;
      wanted_ = false;
    }
    (void)Refresh();  // a failure keeps the old list until the next round
    next = absl::Now() + period_;
    // Misses ask again at most once a second.
    absl::MutexLock lock(&mu_);
    auto stopping = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_; };
    mu_.AwaitWithTimeout(absl::Condition(&stopping), absl::Seconds(1));
    if (stopping_) return;
  }
}

std::shared_ptr<const SegmentDirectory::Snapshot> SegmentDirectory::Current() {
  absl::MutexLock lock(&mu_);
  return snapshot_;
}

std::optional<std::string> SegmentDirectory::ShmSocket(const std::string& endpoint) {
  std::shared_ptr<const Snapshot> snapshot = Current();
  auto it = snapshot->local.find(endpoint);
  if (it == snapshot->local.end()) {
    if (!snapshot->remote.contains(endpoint)) {
      absl::MutexLock lock(&mu_);
      wanted_ = true;
    }
    return std::nullopt;
  }
  if (it->second.empty()) return std::nullopt;
  return it->second;
}

std::vector<std::string> SegmentDirectory::LocalShmEndpoints() {
  std::shared_ptr<const Snapshot> snapshot = Current();
  std::vector<std::string> endpoints;
  for (const auto& [endpoint, socket] : snapshot->local) {
    if (!socket.empty()) endpoints.push_back(endpoint);
  }
  return endpoints;
}

std::optional<SegmentDirectory::KeyHome> SegmentDirectory::HomeOf(absl::string_view key) {
  std::shared_ptr<const Snapshot> snapshot = Current();
  std::string stored = wire::TenantKey(snapshot->tenant, key);
  const SegmentEntry* home = nullptr;
  double best = 0;
  for (const SegmentEntry& segment : snapshot->active) {
    double score = wire::HomeScore(stored, segment.name, segment.capacity);
    if (home == nullptr || score > best) home = &segment, best = score;
  }
  if (home == nullptr || !home->key_read_credential.has_value() ||
      home->key_read_expiry - kCredentialMargin < absl::Now()) {
    return std::nullopt;
  }
  auto local = snapshot->local.find(home->endpoint);
  return KeyHome{.endpoint = home->endpoint,
                 .local = local != snapshot->local.end() && !local->second.empty(),
                 .tenant = snapshot->tenant,
                 .credential = *home->key_read_credential};
}

uint64_t SegmentDirectory::refreshes() {
  absl::MutexLock lock(&mu_);
  return refreshes_;
}

}  // namespace kvpool::client
