#include "server/segment/manifest.h"

#include "absl/container/flat_hash_set.h"

namespace kvpool::segment {

void Manifest::Apply(const std::vector<v1::ManifestRecord>& records) {
  absl::MutexLock lock(&mu_);
  for (const v1::ManifestRecord& record : records) {
    if (record.kind() == v1::ManifestRecord::ADD) {
      DropOverlappingLocked(record.offset(), std::max<uint64_t>(record.size(), 1));
      auto entry = by_offset_.insert_or_assign(record.offset(), record).first;
      by_key_[record.key()] = entry;  // the latest, should a key have two
    } else if (record.kind() == v1::ManifestRecord::FORGET) {
      auto it = by_offset_.find(record.offset());
      if (it != by_offset_.end() && it->second.key() == record.key()) EraseLocked(it);
    }
  }
}

void Manifest::DropOverlapping(uint64_t offset, uint64_t length) {
  absl::MutexLock lock(&mu_);
  DropOverlappingLocked(offset, length);
}

void Manifest::DropOverlappingLocked(uint64_t offset, uint64_t length) {
  if (length == 0) return;
  uint64_t end = offset + length;
  auto it = by_offset_.lower_bound(offset);
  if (it != by_offset_.begin()) {
    auto before = std::prev(it);
    if (before->first + before->second.size() > offset) it = before;
  }
  while (it != by_offset_.end() && it->first < end) it = EraseLocked(it);
}

Manifest::Entries_::iterator Manifest::EraseLocked(Entries_::iterator it) {
  if (it == by_offset_.end()) return it;
  if (auto key = by_key_.find(it->second.key()); key != by_key_.end() && key->second == it) {
    by_key_.erase(key);
  }
  uint64_t offset = it->first;
  uint64_t size = std::max<uint64_t>(it->second.size(), 1);
  Entries_::iterator next = by_offset_.erase(it);
  if (on_drop_) on_drop_(offset, size);
  return next;
}

std::optional<Manifest::Found> Manifest::Find(absl::string_view stored_key) const {
  absl::MutexLock lock(&mu_);
  auto key = by_key_.find(stored_key);
  if (key == by_key_.end()) return std::nullopt;
  const v1::ManifestRecord& entry = key->second->second;
  return Found{entry.offset(), entry.size(), entry.checksum(), entry.grant()};
}

bool Manifest::Holds(absl::string_view stored_key, const Found& found) const {
  absl::MutexLock lock(&mu_);
  auto key = by_key_.find(stored_key);
  if (key == by_key_.end() || key->second->first != found.offset) return false;
  const v1::ManifestRecord& entry = key->second->second;
  return entry.size() == found.size && entry.grant() == found.grant &&
         entry.checksum() == found.checksum;
}

void Manifest::NoteRead(absl::string_view stored_key) {
  absl::MutexLock lock(&reads_mu_);
  if (reads_.size() < kMaxReadsNoted) reads_.emplace(stored_key);
}

std::vector<std::string> Manifest::TakeReads() {
  absl::flat_hash_set<std::string> taken;
  {
    absl::MutexLock lock(&reads_mu_);
    taken.swap(reads_);
  }
  return std::vector<std::string>(std::make_move_iterator(taken.begin()),
                                  std::make_move_iterator(taken.end()));
}

void Manifest::Forget(absl::Span<const std::string> keys) {
  absl::flat_hash_set<std::string> refused(keys.begin(), keys.end());
  absl::MutexLock lock(&mu_);
  for (auto it = by_offset_.begin(); it != by_offset_.end();) {
    it = refused.contains(it->second.key()) ? EraseLocked(it) : std::next(it);
  }
}

std::vector<v1::ManifestRecord> Manifest::Entries() const {
  absl::MutexLock lock(&mu_);
  std::vector<v1::ManifestRecord> entries;
  entries.reserve(by_offset_.size());
  for (const auto& [offset, record] : by_offset_) entries.push_back(record);
  return entries;
}

size_t Manifest::size() const {
  absl::MutexLock lock(&mu_);
  return by_offset_.size();
}

}  // namespace kvpool::segment
