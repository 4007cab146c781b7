#include "server/segment/grant_table.h"

#include <algorithm>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "proto/capability.h"
#include "proto/key_read.h"

namespace kvpool::segment {
namespace {

// Clocks of master and segment may differ a little.
constexpr absl::Duration kClockSlack = absl::Seconds(5);

// Unix milliseconds, rounded up (an ended grant is remembered a little longer, never less), in
// what GrantTable::Ended holds: before 1970 is 0 (expired anyway), the infinite future the
// largest value (never pruned).
int64_t CeilMillis(absl::Time t) {
  constexpr int64_t kLatest = std::numeric_limits<int64_t>::max() >> 1;
  if (t <= absl::UnixEpoch()) return 0;
  if (t >= absl::FromUnixMillis(kLatest)) return kLatest;
  const int64_t ms = absl::ToUnixMillis(t);
  return absl::FromUnixMillis(ms) < t ? ms + 1 : ms;
}

}  // namespace

bool GrantTable::Write::Land(absl::FunctionRef<void()> land) {
  absl::MutexLock lock(&mu_);
  if (ended_) return false;
  if (absl::Now() > expiry_) {
    ended_ = true;
    return false;
  }
  land();
  return true;
}

void GrantTable::Write::End() {
  absl::MutexLock lock(&mu_);  // waits for a Land in progress
  ended_ = true;
}

GrantTable::GrantTable(std::string secret, bool require_token, size_t max_ended)
    : require_token_(require_token), max_ended_(std::max<size_t>(max_ended, 4)),
      secret_(std::move(secret)), key_(secret_), next_key_("") {}

absl::Status GrantTable::CheckLocked(const wire::RequestHeader& request, absl::Time now,
                                     bool* next_term) const {
  if (!require_token_) return absl::OkStatus();
  absl::Status granted = wire::VerifyToken(key_, request, now);
  if (!granted.ok() && request.opcode == wire::Opcode::kRead && !next_secret_.empty() &&
      wire::VerifyToken(next_key_, request, now).ok()) {
    // A read of the next term, whose master has ended none of its grants yet.
    if (next_term != nullptr) *next_term = true;
    return absl::OkStatus();
  }
  if (!granted.ok()) return granted;
  uint64_t grant = wire::TokenGrant(request.token);
  if (grant != 0 && wire::TokenExpiry(request.token) <= refused_through_) {
    return absl::FailedPreconditionError(
        "this token's grant may have ended and is no longer remembered (the segment's table of "
        "ended grants overflowed); ask the master for a new token");
  }
  if (auto it = ended_.find(grant); grant != 0 && it != ended_.end()) {
    if (request.opcode == wire::Opcode::kWrite) {
      return absl::FailedPreconditionError(
          "the grant of this token has ended (committed, revoked, reclaimed or removed)");
    }
    if (!it->second.writes_only()) {
      return absl::FailedPreconditionError(
          "the grant of this token has ended (the object was removed or evicted)");
    }
  }
  return absl::OkStatus();
}

absl::Status GrantTable::CheckRead(const wire::RequestHeader& request, absl::Time now) const {
  absl::ReaderMutexLock lock(&mu_);
  return CheckLocked(request, now);
}

absl::StatusOr<uint64_t> GrantTable::BeginRead(const wire::RequestHeader& request, absl::Time now,
                                               Cut cut) {
  absl::MutexLock lock(&mu_);
  bool next_term = false;
  if (absl::Status checked = CheckLocked(request, now, &next_term); !checked.ok()) {
    return checked;
  }
  uint64_t grant = require_token_ ? wire::TokenGrant(request.token) : 0;
  uint64_t read = ++next_read_;
  if (grant != 0) reads_.emplace(read, InFlightRead{grant, std::move(cut), next_term});
  return read;
}

absl::Status GrantTable::CheckKeyReadCredential(const wire::Token& credential,
                                                absl::string_view tenant, absl::Time now) const {
  if (!require_token_) return absl::OkStatus();
  absl::ReaderMutexLock lock(&mu_);
  absl::Status verified = wire::VerifyKeyReadCredential(key_, credential, tenant, now);
  if (!verified.ok() && !next_secret_.empty() &&
      wire::VerifyKeyReadCredential(next_key_, credential, tenant, now).ok()) {
    return absl::OkStatus();
  }
  return verified;
}

uint64_t GrantTable::BeginKeyRead(uint64_t offset, uint64_t length, Cut cut) {
  absl::MutexLock lock(&mu_);
  uint64_t read = ++next_read_;
  reads_.emplace(
      read,
      InFlightRead{.grant = 0, .cut = std::move(cut), .key_offset = offset, .key_length = length});
  return read;
}

void GrantTable::CutKeyReads(uint64_t offset, uint64_t length) {
  absl::MutexLock lock(&mu_);
  absl::erase_if(reads_, [&](auto& entry) {
    const InFlightRead& read = entry.second;
    if (read.grant != 0 || read.key_length == 0) return false;
    if (read.key_offset >= offset + length || offset >= read.key_offset + read.key_length) {
      return false;
    }
    if (read.cut()) ++reads_cut_;
    return true;
  });
}

void GrantTable::EndRead(uint64_t read) {
  absl::MutexLock lock(&mu_);
  reads_.erase(read);
}

void GrantTable::CutReadsLocked(bool all, uint64_t grant) {
  absl::erase_if(reads_, [&](auto& entry) {
    if (entry.second.next_term) return false;  // not a grant of this term
    if (!all && entry.second.grant != grant) return false;
    if (entry.second.cut()) ++reads_cut_;
    return true;
  });
}

absl::StatusOr<std::shared_ptr<GrantTable::Write>> GrantTable::BeginWrite(
    const wire::RequestHeader& request, absl::Time now, WriteKind kind) {
  absl::MutexLock lock(&mu_);
  const bool shm = kind == WriteKind::kShm;
  if (absl::Status checked = CheckLocked(request, now); !checked.ok()) {
    if (shm) ++shm_refused_;
    return checked;
  }
  uint64_t grant = require_token_ ? wire::TokenGrant(request.token) : 0;
  // A shared-memory write of another grant (or of an earlier term, whose grant numbers may
  // repeat) may still be copying into this range: nothing else may write there until it is
  // done, or the two would mix.
  const uint64_t reach = request.offset - std::min(request.offset, shm_max_length_);
  for (auto it = shm_writes_.lower_bound(reach);
       it != shm_writes_.end() && it->first < request.offset + request.length; ++it) {
    const Write* busy = it->second;
    bool same = busy->grant_ == grant && busy->term_ == term_;
    bool overlaps = request.offset < busy->offset_ + busy->length_;
    if (!same && overlaps) {
      ++busy_refused_;
      if (shm) ++shm_refused_;
      return absl::UnavailableError(absl::StrCat(
          "range [", request.offset, ", +", request.length,
          ") is busy: a shared-memory write of an ended grant (or of another grant) is still "
          "copying into it; put again"));
    }
  }
  absl::Time expiry = require_token_ ? wire::TokenExpiry(request.token) : absl::InfiniteFuture();
  std::shared_ptr<Write> write(new Write(grant, term_, request.offset, request.length, shm,
                                         expiry, ++next_write_seq_,
                                         /*alone=*/!writes_.contains(grant)));
  writes_.emplace(grant, write);
  if (shm) {
    shm_writes_.emplace(write->offset_, write.get());
    shm_max_length_ = std::max(shm_max_length_, write->length_);
    ++shm_begun_;
  }
  if (grant != 0) {
    Written& written = written_[grant];
    written.last_begun = write->seq_;
    written.landed.reset();  // the range is changing
  }
  return write;
}

void GrantTable::EndWrite(const std::shared_ptr<Write>& write, std::optional<Landed> landed) {
  absl::MutexLock lock(&mu_);
  const uint64_t grant = write->grant();
  auto [first, last] = writes_.equal_range(grant);
  bool found = false;
  for (auto it = first; it != last; ++it) {
    if (it->second == write) {
      writes_.erase(it);
      found = true;
      break;
    }
  }
  if (!found) return;  // ended twice
  for (auto [it, end] = shm_writes_.equal_range(write->offset_); it != end; ++it) {
    if (it->second != write.get()) continue;
    shm_writes_.erase(it);
    if (shm_writes_.empty()) shm_max_length_ = 0;
    break;
  }
  if (write->orphaned_ || write->term_ != term_) return;  // ended (End, NewTerm)
  auto written = written_.find(grant);
  if (written == written_.end()) return;  // the grant's writes ended (End)
  if (landed && write->alone_ && written->second.last_begun == write->seq_ &&
      !writes_.contains(grant) && !ended_.contains(grant)) {
    written->second.landed = landed;
  } else {
    written->second.landed.reset();
  }
}

std::optional<GrantTable::Landed> GrantTable::End(uint64_t grant, bool writes_only,
                                                  absl::Time until) {
  if (grant == 0) return std::nullopt;
  absl::MutexLock lock(&mu_);
  std::optional<Landed> landed;
  if (auto written = written_.find(grant); written != written_.end()) {
    landed = written->second.landed;
    written_.erase(written);
  }
  const int64_t until_ms = CeilMillis(until);
  auto [it, inserted] = ended_.try_emplace(grant, until_ms, writes_only);
  if (inserted || until_ms > it->second.until_ms()) {
    // (Grants end in about the order their tokens expire: the last bucket, mostly.)
    auto bucket = !expiry_.empty() && expiry_.rbegin()->first == until_ms
                      ? std::prev(expiry_.end())
                      : expiry_.try_emplace(until_ms).first;
    bucket->second.push_back(grant);
    ++expiry_entries_;
  }
  if (!inserted) {
    it->second =
        Ended(std::max(it->second.until_ms(), until_ms), it->second.writes_only() && writes_only);
  }
  auto [first, last] = writes_.equal_range(grant);
  bool deferred = false;
  for (auto write = first; write != last; ++write) {
    if (write->second->term_ != term_) continue;  // the same number in an earlier term
    write->second->orphaned_ = true;
    deferred = deferred || write->second->shm_;
    write->second->End();
  }
  if (deferred) ++deferred_ends_;
  if (!writes_only && !reads_.empty()) CutReadsLocked(/*all=*/false, grant);
  PruneLocked(absl::Now());
  // (Every End adds at most one entry to expiry_: twice the cap bounds its stale ones too.)
  if (ended_.size() > max_ended_ || expiry_entries_ > 2 * max_ended_) ForgetEarliestLocked();
  return landed;
}

size_t GrantTable::PopEarliestLocked() {
  auto bucket = expiry_.begin();
  size_t dropped = 0;
  for (uint64_t grant : bucket->second) {
    auto it = ended_.find(grant);
    if (it != ended_.end() && it->second.until_ms() == bucket->first) {
      ended_.erase(it);
      ++dropped;
    }
  }
  expiry_entries_ -= bucket->second.size();
  expiry_.erase(bucket);
  return dropped;
}

void GrantTable::ForgetEarliestLocked() {
  // The quarter with the earliest expiries goes, whole buckets (ties included).
  const size_t goal = std::max<size_t>(1, ended_.size() / 4);
  size_t forgotten = 0;
  int64_t through = 0;
  while (!expiry_.empty() && (forgotten < goal || expiry_entries_ > 2 * max_ended_)) {
    through = expiry_.begin()->first;
    forgotten += PopEarliestLocked();
  }
  overflowed_ += forgotten;
  refused_through_ = std::max(refused_through_, absl::FromUnixMillis(through));
}

void GrantTable::PrepareTerm(std::string next_secret) {
  absl::MutexLock lock(&mu_);
  next_key_ = wire::TokenKey(next_secret);
  next_secret_ = std::move(next_secret);
}

void GrantTable::NewTerm(std::string secret) {
  absl::MutexLock lock(&mu_);
  bool prepared = secret == next_secret_;
  key_ = prepared ? std::move(next_key_) : wire::TokenKey(secret);
  next_key_ = wire::TokenKey("");
  secret_ = std::move(secret);
  next_secret_.clear();
  ended_.clear();  // tokens of the old term no longer verify at all
  expiry_.clear();
  expiry_entries_ = 0;
  refused_through_ = absl::InfinitePast();
  written_.clear();
  ++term_;
  bool deferred = false;
  for (auto& [grant, write] : writes_) {
    write->orphaned_ = true;
    deferred = deferred || write->shm_;
    write->End();
  }
  if (deferred) ++deferred_ends_;
  // Every read in flight is cut but those that verified under the new secret (prepared):
  // they are of this term now, cut when it ends their grant.
  absl::erase_if(reads_, [&](auto& entry) {
    if (prepared && entry.second.next_term) {
      entry.second.next_term = false;
      return false;
    }
    if (entry.second.cut()) ++reads_cut_;
    return true;
  });
}

void GrantTable::PruneLocked(absl::Time now) {
  const int64_t expired = absl::ToUnixMillis(now - kClockSlack);  // and before
  while (!expiry_.empty() && expiry_.begin()->first < expired) PopEarliestLocked();
}

std::string GrantTable::secret() const {
  absl::ReaderMutexLock lock(&mu_);
  return secret_;
}

size_t GrantTable::ended_count() const {
  absl::ReaderMutexLock lock(&mu_);
  return ended_.size();
}

uint64_t GrantTable::ended_overflowed() const {
  absl::ReaderMutexLock lock(&mu_);
  return overflowed_;
}

size_t GrantTable::grants_written() const {
  absl::ReaderMutexLock lock(&mu_);
  return written_.size();
}

size_t GrantTable::reads_in_flight() const {
  absl::ReaderMutexLock lock(&mu_);
  return reads_.size();
}

uint64_t GrantTable::reads_cut() const {
  absl::ReaderMutexLock lock(&mu_);
  return reads_cut_;
}

uint64_t GrantTable::shm_writes_begun() const {
  absl::ReaderMutexLock lock(&mu_);
  return shm_begun_;
}

uint64_t GrantTable::shm_writes_refused() const {
  absl::ReaderMutexLock lock(&mu_);
  return shm_refused_;
}

size_t GrantTable::shm_writes_in_flight() const {
  absl::ReaderMutexLock lock(&mu_);
  return shm_writes_.size();
}

uint64_t GrantTable::busy_refused() const {
  absl::ReaderMutexLock lock(&mu_);
  return busy_refused_;
}

uint64_t GrantTable::deferred_ends() const {
  absl::ReaderMutexLock lock(&mu_);
  return deferred_ends_;
}

uint64_t GrantTable::busy_bytes() const {
  absl::ReaderMutexLock lock(&mu_);
  uint64_t bytes = 0;
  for (const auto& [offset, write] : shm_writes_) {
    if (write->orphaned_) bytes += write->length_;
  }
  return bytes;
}

std::vector<wire::ByteRange> GrantTable::BusyRanges(bool every_shm_write) const {
  std::vector<wire::ByteRange> busy;
  {
    absl::ReaderMutexLock lock(&mu_);
    for (const auto& [offset, write] : shm_writes_) {
      if (every_shm_write || write->orphaned_) busy.push_back({offset, write->length_});
    }
  }
  return wire::CoalesceRanges(std::move(busy), wire::kMaxBusyRanges);
}

size_t GrantTable::writes_in_flight() const {
  absl::ReaderMutexLock lock(&mu_);
  return writes_.size();
}

}  // namespace kvpool::segment
