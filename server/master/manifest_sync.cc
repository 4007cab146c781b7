#include "server/master/manifest_sync.h"

#include <limits>

namespace kvpool::master {

void ManifestSync::Track(SegmentId segment) {
  absl::MutexLock lock(&mu_);
  queues_.try_emplace(segment);
}

void ManifestSync::TrackLocal(SegmentId segment, std::function<void(const ManifestRecord&)> apply) {
  absl::MutexLock lock(&mu_);
  queues_[segment].local = std::move(apply);
}

void ManifestSync::Untrack(SegmentId segment) {
  std::function<void()> poll;
  std::vector<std::pair<std::function<void(bool)>, bool>> done;
  std::deque<std::pair<uint64_t, std::function<void()>>> after;
  {
    absl::MutexLock lock(&mu_);
    auto it = queues_.find(segment);
    if (it == queues_.end()) return;
    poll = std::move(it->second.poll);
    after = std::move(it->second.after_applied);
    if (!it->second.local) {
      gone_[segment] = Gone{.acked = it->second.acked, .last_seq = it->second.next_seq - 1};
      gone_order_.push_back(segment);
      if (gone_order_.size() > kMaxGone) {
        gone_.erase(gone_order_.front());
        gone_order_.pop_front();
      }
    }
    queues_.erase(it);
    done = ReleaseLocked(segment, std::numeric_limits<uint64_t>::max(), /*gone=*/true);
  }
  if (poll) poll();
  for (auto& [seq, then] : after) then();
  for (auto& [callback, ok] : done) callback(ok);
}

void ManifestSync::Append(SegmentId segment, ManifestRecord record, Ticket* ticket,
                          DeferredPolls* deferred) {
  AppendThen(segment, std::move(record), ticket, nullptr, nullptr, deferred);
}

void ManifestSync::AppendThen(SegmentId segment, ManifestRecord record, Ticket* ticket,
                              std::function<void()> then, std::function<void()> refused,
                              DeferredPolls* deferred) {
  std::function<void()> poll;
  std::function<void(const ManifestRecord&)> local;
  bool queued = false;
  {
    absl::MutexLock lock(&mu_);
    auto it = queues_.find(segment);
    if (it != queues_.end() && it->second.local) {
      local = it->second.local;
    } else if (it != queues_.end()) {
      queued = true;
      Queue& queue = it->second;
      uint64_t seq = queue.next_seq++;
      queue.records.push_back(std::move(record));
      if (then) queue.after_applied.emplace_back(seq, std::move(then));
      if (refused) queue.if_refused.emplace(seq, std::move(refused));
      if (ticket != nullptr) ticket->waits.emplace_back(segment, seq);
      poll = std::move(queue.poll);
      queue.poll = nullptr;
    } else if (ticket != nullptr) {
      // Gone between the caller's look at the index and now: the record reaches no manifest.
      ticket->waits.emplace_back(segment, kNeverApplied);
    }
  }
  if (local) local(record);
  if (poll && deferred != nullptr) {
    deferred->polls_.push_back(std::move(poll));
  } else if (poll) {
    poll();
  }
  if (!queued && then) then();
}

void ManifestSync::Barrier(SegmentId segment, Ticket* ticket) {
  absl::MutexLock lock(&mu_);
  auto it = queues_.find(segment);
  if (it == queues_.end()) {
    // What was queued when it went: Wait fails it unless it had all been applied.
    if (auto gone = gone_.find(segment); gone != gone_.end() &&
                                         gone->second.last_seq > gone->second.acked) {
      ticket->waits.emplace_back(segment, gone->second.last_seq);
    }
    return;
  }
  if (it->second.local) return;
  if (it->second.next_seq - 1 > it->second.acked) {
    ticket->waits.emplace_back(segment, it->second.next_seq - 1);
  }
}

bool ManifestSync::AppliedBeforeGoneLocked(SegmentId segment, uint64_t seq) const {
  auto gone = gone_.find(segment);
  return gone != gone_.end() && gone->second.acked >= seq;
}

bool ManifestSync::Applied(const Ticket& ticket) {
  absl::MutexLock lock(&mu_);
  for (const auto& [segment, seq] : ticket.waits) {
    auto it = queues_.find(segment);
    if (it != queues_.end() && !it->second.local && it->second.acked < seq) return false;
  }
  return true;
}

ManifestSync::Batch ManifestSync::Sync(SegmentId segment, uint64_t acked, size_t max_records,
                                       absl::Span<const uint64_t> refused) {
  Batch batch;
  std::vector<std::pair<std::function<void(bool)>, bool>> done;
  std::vector<std::function<void()>> after;
  std::vector<std::function<void()>> refusals;
  {
    absl::MutexLock lock(&mu_);
    auto it = queues_.find(segment);
    if (it == queues_.end()) return batch;
    Queue& queue = it->second;
    // A segment cannot have applied what was never sent (e.g. numbers from a previous
    // master): clamp, so nothing is skipped.
    acked = std::min(acked, queue.next_seq - 1);
    for (uint64_t seq : refused) {
      if (seq <= queue.acked || seq > acked) continue;  // not newly acknowledged
      if (auto it = queue.if_refused.find(seq); it != queue.if_refused.end()) {
        refusals.push_back(std::move(it->second));
        queue.if_refused.erase(it);
      }
    }
    while (queue.acked < acked) {
      queue.records.pop_front();
      ++queue.acked;
      queue.if_refused.erase(queue.acked);
    }
    done = ReleaseLocked(segment, queue.acked);
    while (!queue.after_applied.empty() && queue.after_applied.front().first <= queue.acked) {
      after.push_back(std::move(queue.after_applied.front().second));
      queue.after_applied.pop_front();
    }
    size_t n = std::min(max_records, queue.records.size());
    batch.records.assign(queue.records.begin(), queue.records.begin() + n);
    batch.last_seq = queue.acked + n;
    batch.more = n < queue.records.size();
  }
  for (auto& refusal : refusals) refusal();
  for (auto& then : after) then();
  for (auto& [callback, ok] : done) callback(ok);
  return batch;
}

void ManifestSync::Poll(SegmentId segment, absl::Time deadline, std::function<void()> ready) {
  std::function<void()> replaced;
  bool now = false;
  {
    absl::MutexLock lock(&mu_);
    auto it = queues_.find(segment);
    if (closed_ || it == queues_.end() || !it->second.records.empty()) {
      now = true;
    } else {
      replaced = std::move(it->second.poll);
      it->second.poll = std::move(ready);
      it->second.poll_deadline = deadline;
    }
  }
  if (replaced) replaced();
  if (now) ready();
}

void ManifestSync::Wait(Ticket ticket, absl::Time deadline, std::function<void(bool)> done) {
  bool durable = true;
  {
    absl::MutexLock lock(&mu_);
    auto waiter = std::make_unique<Waiter>();
    for (const auto& [segment, seq] : ticket.waits) {
      auto it = queues_.find(segment);
      if (it == queues_.end()) {
        // Gone before this call (Untrack released only the waiters already here).
        durable = durable && AppliedBeforeGoneLocked(segment, seq);
      } else if (!it->second.local && it->second.acked < seq) {
        uint64_t& needed = waiter->remaining[segment];
        needed = std::max(needed, seq);
      }
    }
    // Closed: nothing parks, and what is not applied yet is not known to be durable.
    if (closed_ && !waiter->remaining.empty()) durable = false;
    if (durable && !waiter->remaining.empty()) {
      waiter->deadline = deadline;
      waiter->done = std::move(done);
      waiters_.push_back(std::move(waiter));
      return;
    }
  }
  done(durable);
}

void ManifestSync::Tick(absl::Time now) {
  std::vector<std::function<void()>> polls;
  std::vector<std::function<void(bool)>> expired;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [segment, queue] : queues_) {
      if (queue.poll && queue.poll_deadline <= now) {
        polls.push_back(std::move(queue.poll));
        queue.poll = nullptr;
      }
    }
    for (auto it = waiters_.begin(); it != waiters_.end();) {
      if ((*it)->deadline <= now) {
        expired.push_back(std::move((*it)->done));
        it = waiters_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& poll : polls) poll();
  for (auto& callback : expired) callback(false);
}

void ManifestSync::Close() {
  std::vector<std::function<void()>> polls;
  std::vector<std::function<void(bool)>> waiting;
  {
    absl::MutexLock lock(&mu_);
    closed_ = true;
    for (auto& [segment, queue] : queues_) {
      if (queue.poll) polls.push_back(std::move(queue.poll));
      queue.poll = nullptr;
    }
    for (auto& waiter : waiters_) waiting.push_back(std::move(waiter->done));
    waiters_.clear();
  }
  for (auto& poll : polls) poll();
  for (auto& done : waiting) done(false);
}

std::vector<std::pair<std::function<void(bool)>, bool>> ManifestSync::ReleaseLocked(
    SegmentId segment, uint64_t applied, bool gone) {
  std::vector<std::pair<std::function<void(bool)>, bool>> done;
  for (auto it = waiters_.begin(); it != waiters_.end();) {
    Waiter& waiter = **it;
    auto needed = waiter.remaining.find(segment);
    if (needed != waiter.remaining.end() && needed->second <= applied) {
      waiter.remaining.erase(needed);
      if (gone) waiter.failed = true;
    }
    if (waiter.remaining.empty()) {
      done.emplace_back(std::move(waiter.done), !waiter.failed);
      it = waiters_.erase(it);
    } else {
      ++it;
    }
  }
  return done;
}

}  // namespace kvpool::master
