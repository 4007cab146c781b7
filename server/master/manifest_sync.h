#pragma once

// Keeps each segment's manifest (the list of committed objects it holds) in step with the
// index, so that a restarted master can rebuild the index from the segments.
//
// The master appends records (an object committed, an object forgotten) to a per-segment
// queue, each with a sequence number. The segment's heartbeat is a long poll: it carries
// the last sequence number the segment applied and is answered with the records after it,
// at once if there are any, else as soon as one is appended or the poll's time is up.
// BatchPutEnd and BatchRemove wait (Wait) until the segments have applied their records
// before answering, so an object a client saw committed survives a master restart.
//
// Records also fence grants (docs/semantics.md): ADD ends the writes of its replica's grant,
// FORGET ends the grant altogether. A range whose grant ends is given back to the allocator
// only once the segment has applied the FORGET (AppendThen), so a range is never handed out
// again while a late or paused writer of its old grant could still land bytes in it.
//
// Embedded segments keep no manifest (they die with the master): they are tracked as local
// (TrackLocal), and each record is applied to them at once, in the master's process. A
// segment untracked (gone: unmounted, dead, or mounted afresh) takes its unapplied records
// with it: a ticket that waits on one of them, or on a record appended after it went, fails,
// however late Wait is called. Thread-safe; callbacks run without the lock held.

#include <cstdint>
#include <deque>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "absl/time/time.h"
#include "server/master/index_shard.h"
#include "server/master/segment_registry.h"

namespace kvpool::master {

class ManifestSync {
 public:
  // What a batch must wait for: per segment, the sequence number to be applied.
  struct Ticket {
    std::vector<std::pair<SegmentId, uint64_t>> waits;
    bool empty() const { return waits.empty(); }
  };

  // Polls that a batch of appends answers once, after its last record, so that the batch goes
  // out in one heartbeat answer (not its first record, then the rest in another round trip):
  // AppendThen moves the poll it would answer here, and the destructor answers them.
  class DeferredPolls {
   public:
    DeferredPolls() = default;
    DeferredPolls(const DeferredPolls&) = delete;
    DeferredPolls& operator=(const DeferredPolls&) = delete;
    ~DeferredPolls() {
      for (std::function<void()>& poll : polls_) poll();
    }

   private:
    friend class ManifestSync;
    std::vector<std::function<void()>> polls_;
  };

  struct Batch {
    std::vector<ManifestRecord> records;
    // Sequence number of the last record in `records` (or the acknowledged one if none).
    uint64_t last_seq = 0;
    // More records are queued beyond this batch.
    bool more = false;
  };

  void Track(SegmentId segment) ABSL_LOCKS_EXCLUDED(mu_);
  // A segment in this process: each record is handed to `apply` as it is appended.
  void TrackLocal(SegmentId segment, std::function<void(const ManifestRecord&)> apply)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The segment is gone: its queue is dropped, its poll answered, its AppendThen callbacks
  // run, and the waiters on it released as not durable (done(false)).
  void Untrack(SegmentId segment) ABSL_LOCKS_EXCLUDED(mu_);

  // Queues a record for a tracked segment and adds it to `ticket` (if given): to a segment
  // already gone, a record the ticket can never see applied. The segment's parked poll is
  // answered at once, or by `deferred` (if given) when it goes.
  void Append(SegmentId segment, ManifestRecord record, Ticket* ticket,
              DeferredPolls* deferred = nullptr) ABSL_LOCKS_EXCLUDED(mu_);
  // Append, and runs `then` once the segment has applied the record (or is gone; at once for
  // a local or untracked segment). `then` may run on the caller's thread.
  // `refused` (if given) runs instead of nothing when the segment reports that it refused
  // the record (an ADD whose range does not hold the bytes of its checksum), before `then`
  // and before the waiters on the record are released.
  void AppendThen(SegmentId segment, ManifestRecord record, Ticket* ticket,
                  std::function<void()> then, std::function<void()> refused = nullptr,
                  DeferredPolls* deferred = nullptr) ABSL_LOCKS_EXCLUDED(mu_);
  // Adds to `ticket` everything queued for the segment so far (for a segment gone, what was
  // queued when it went).
  void Barrier(SegmentId segment, Ticket* ticket) ABSL_LOCKS_EXCLUDED(mu_);
  // Whether nothing of `ticket` is left to wait for: every record applied, or its segment
  // local or gone (nothing more will ever be applied there; Wait counts a record a gone
  // segment had not applied as a failure instead).
  bool Applied(const Ticket& ticket) ABSL_LOCKS_EXCLUDED(mu_);

  // Acknowledges every record up to `acked` (releasing waiters; those in `refused` were
  // refused by the segment, see AppendThen) and returns up to `max_records` records after it.
  Batch Sync(SegmentId segment, uint64_t acked, size_t max_records,
             absl::Span<const uint64_t> refused = {}) ABSL_LOCKS_EXCLUDED(mu_);

  // Parks a heartbeat poll: `ready` runs once, when a record is appended for the segment,
  // the segment is untracked, or `deadline` passes (Tick). A newer poll replaces (and
  // releases) an older one.
  void Poll(SegmentId segment, absl::Time deadline, std::function<void()> ready)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Runs `done(true)` once every record of the ticket is applied, or `done(false)` at
  // `deadline` (Tick) or when a segment of the ticket goes away first (also if it went
  // before this call). Runs at once if there is nothing to wait for.
  void Wait(Ticket ticket, absl::Time deadline, std::function<void(bool)> done)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Releases polls and waiters whose deadline passed. Called every few milliseconds.
  void Tick(absl::Time now) ABSL_LOCKS_EXCLUDED(mu_);

  // For shutdown: answers every parked poll and releases every waiter now, and from here on
  // parks nothing (a server cannot stop while a call it holds is unanswered).
  void Close() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Waiter {
    absl::flat_hash_map<SegmentId, uint64_t> remaining;
    absl::Time deadline;
    std::function<void(bool)> done;
    bool failed = false;
  };
  struct Queue {
    uint64_t next_seq = 1;
    uint64_t acked = 0;
    std::deque<ManifestRecord> records;  // seq acked+1 ...
    std::function<void()> poll;
    absl::Time poll_deadline;
    // Run once the record of that sequence number is applied.
    std::deque<std::pair<uint64_t, std::function<void()>>> after_applied;
    // Run if the segment refuses the record of that sequence number.
    absl::flat_hash_map<uint64_t, std::function<void()>> if_refused;
    // Set for a local segment.
    std::function<void(const ManifestRecord&)> local;
  };

  // Removes the waiters `segment` no longer holds up and returns those now complete.
  // `gone`: the segment went away, so whoever waited on it failed.
  std::vector<std::pair<std::function<void(bool)>, bool>> ReleaseLocked(SegmentId segment,
                                                                        uint64_t applied,
                                                                        bool gone = false)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // What a segment gone had applied, and the last record queued for it, when it went.
  struct Gone {
    uint64_t acked = 0;
    uint64_t last_seq = 0;
  };
  // The most segments gone remembered; a ticket on one forgotten since fails.
  static constexpr size_t kMaxGone = 4096;
  // A ticket's wait on a record that was never queued (appended after its segment went).
  static constexpr uint64_t kNeverApplied = std::numeric_limits<uint64_t>::max();

  // Whether `seq` of a segment no longer tracked was applied before it went.
  bool AppliedBeforeGoneLocked(SegmentId segment, uint64_t seq) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  absl::flat_hash_map<SegmentId, Queue> queues_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<SegmentId, Gone> gone_ ABSL_GUARDED_BY(mu_);
  std::deque<SegmentId> gone_order_ ABSL_GUARDED_BY(mu_);  // oldest first, for kMaxGone
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::unique_ptr<Waiter>> waiters_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvpool::master
