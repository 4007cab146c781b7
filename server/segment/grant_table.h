#pragma once

// Which capability tokens this segment honours: the fence between the master's decisions and
// the bytes of the pool (docs/semantics.md, "Grants").
//
// A token is honoured only if it verifies under the secret of the current term (the segment
// draws a new secret every time it mounts, so a token of an earlier master, or of an earlier
// mount, is refused), has not expired, and names a grant the master has not ended since. The
// master ends a grant with the manifest records it sends (ADD ends its writes at commit;
// FORGET ends it altogether at revoke, expiry, remove, eviction) and reuses the range only
// once the segment has applied the record. A write in flight when its grant ends, its token
// expires or the term changes lands no further byte: its payload is moved into the pool only
// through Write::Land, which End waits out.
//
// Shared-memory writes (write intents, docs/semantics.md "Grants") are begun here with the
// same checks, but the segment cannot stop a memcpy once it began: such a write is not cut
// when its grant ends or a new term starts. It holds its range until the client says it is
// done (EndWrite) or its connection closes, and until then every other write into that range
// (TCP or shared memory, of another grant or term) is refused (Unavailable), so a range the
// master reused is never written by two grants and the new object is never committed over a
// late write: its writer is refused and puts again.
//
// A write that landed its whole payload, hashed as it landed, leaves its checksum with the
// table (EndWrite); the commit's End hands it back, so checking a TCP commit is a compare,
// not a second pass over the range. A shared-memory write done over its whole range leaves
// its range (unhashed). Thread-safe.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/busy_ranges.h"
#include "proto/capability.h"
#include "proto/frame.h"

namespace kvpool::segment {

class GrantTable {
 public:
  // A write whose header was accepted and whose payload is arriving.
  class Write {
   public:
    // Runs `land` (which moves payload bytes into the pool) if the grant is still open and
    // its token unexpired; false, and nothing runs, once either is over (for good).
    bool Land(absl::FunctionRef<void()> land) ABSL_LOCKS_EXCLUDED(mu_);
    uint64_t grant() const { return grant_; }
    uint64_t offset() const { return offset_; }
    uint64_t length() const { return length_; }

   private:
    friend class GrantTable;
    Write(uint64_t grant, uint64_t term, uint64_t offset, uint64_t length, bool shm,
          absl::Time expiry, uint64_t seq, bool alone)
        : grant_(grant), term_(term), offset_(offset), length_(length), shm_(shm),
          expiry_(expiry), seq_(seq), alone_(alone) {}
    void End() ABSL_LOCKS_EXCLUDED(mu_);

    const uint64_t grant_;
    const uint64_t term_;  // GrantTable's count of terms when it began
    const uint64_t offset_;
    const uint64_t length_;
    const bool shm_;  // a shared-memory write: not cut by End, holds its range until EndWrite
    const absl::Time expiry_;
    const uint64_t seq_;  // the order in which writes began
    const bool alone_;    // no other write of the grant was in flight when it began
    absl::Mutex mu_;
    bool ended_ ABSL_GUARDED_BY(mu_) = false;
    // Its grant ended (or a new term began) while it was in flight: the range it holds may
    // have been given to someone else. Guarded by the table's mu_.
    bool orphaned_ = false;
  };

  // Who moves a write's bytes: the data server (TCP, through Write::Land) or the client
  // itself through its mapping of the pool (shared memory).
  enum class WriteKind { kTcp, kShm };

  // What one write landed: its whole range and the checksum of the bytes as they landed.
  struct Landed {
    uint64_t offset = 0;
    uint64_t length = 0;
    uint64_t checksum = 0;
    // False for a shared-memory write, which says it wrote its range but whose bytes the
    // segment never saw: `checksum` means nothing then.
    bool hashed = true;
  };

  // Ended grants remembered at most, by default (about 35 bytes each, 35 MiB at the cap:
  // 17,000 commits a second for the default put timeout of 60 s).
  static constexpr size_t kDefaultMaxEnded = 1 << 20;

  // `require_token` false (tests, benchmarks): tokens are not verified, grant 0 never ends.
  //
  // Memory is bounded: an ended grant is remembered only until its last token expires
  // (pruned as ends come, in order of expiry), and never more than `max_ended` of them. Past
  // the cap (a commit rate beyond max_ended per put timeout), the quarter with the earliest
  // expiries is forgotten and every token expiring no later than the last of them is refused
  // from then on (FailedPrecondition, counted in ended_overflowed()): forgetting an ended grant
  // never reopens it, at worst an open grant's old token must be renewed.
  GrantTable(std::string secret, bool require_token = true, size_t max_ended = kDefaultMaxEnded);

  // The request's token verifies, is unexpired and names a grant still open for it.
  // PermissionDenied for a token not minted for this request under the current term,
  // DeadlineExceeded for an expired one, FailedPrecondition for a grant the master ended.
  absl::Status CheckRead(const wire::RequestHeader& request, absl::Time now) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // The same check for a READ whose answer is then sent straight from the pool: the read is
  // in flight until EndRead(the id returned). Ending its grant for reads (End, !writes_only)
  // or a new term runs `cut`, which must stop the send for good before it returns (a send
  // under way may finish handing bytes to the kernel first; else the connection's socket is
  // shut down) and says whether it stopped one (false: every byte of the answer had left the
  // pool already, and the connection is kept). End returns only after that, so no byte leaves
  // the range once the segment has applied the end and the master may reuse the range. `cut`
  // runs under the table's lock: it must be quick and not call back into the table.
  using Cut = std::function<bool()>;
  absl::StatusOr<uint64_t> BeginRead(const wire::RequestHeader& request, absl::Time now, Cut cut)
      ABSL_LOCKS_EXCLUDED(mu_);
  void EndRead(uint64_t read) ABSL_LOCKS_EXCLUDED(mu_);
  // Reads by key (READ_KEY, proto/key_read.h). The credential verifies under the current
  // term's secret (or the next term's, see PrepareTerm) for `tenant` and has not expired:
  // PermissionDenied or DeadlineExceeded otherwise.
  absl::Status CheckKeyReadCredential(const wire::Token& credential, absl::string_view tenant,
                                      absl::Time now) const ABSL_LOCKS_EXCLUDED(mu_);
  // A read by key of a manifest entry's range, sent straight from the pool: in flight until
  // EndRead(the id returned). Such reads are not fenced by grants (a restored manifest's
  // entries carry an earlier term's grant ids) but by the manifest: CutKeyReads of an
  // overlapping range, which the segment calls once an entry has left its manifest, runs
  // `cut` as End does for a grant's reads; so does a new term.
  uint64_t BeginKeyRead(uint64_t offset, uint64_t length, Cut cut) ABSL_LOCKS_EXCLUDED(mu_);
  void CutKeyReads(uint64_t offset, uint64_t length) ABSL_LOCKS_EXCLUDED(mu_);
  // The same checks for a write; the write stays in flight until EndWrite. Also Unavailable
  // if its range overlaps a shared-memory write in flight of another grant or term (the
  // range is busy: the caller should put again). A kShm write is never cut (see above).
  absl::StatusOr<std::shared_ptr<Write>> BeginWrite(const wire::RequestHeader& request,
                                                    absl::Time now,
                                                    WriteKind kind = WriteKind::kTcp)
      ABSL_LOCKS_EXCLUDED(mu_);
  // `landed`: the write landed all of its payload (through Land) and these are its bytes'
  // checksum. Kept for the grant's End only if no other write of the grant overlapped this
  // one (in flight when it began, or begun since) and the grant's writes have not ended; any
  // other end of a write
  // (landed or not) drops what the grant kept, since its bytes may have changed since.
  void EndWrite(const std::shared_ptr<Write>& write,
                std::optional<Landed> landed = std::nullopt) ABSL_LOCKS_EXCLUDED(mu_);

  // Ends `grant` (its writes only, or reads too) until `until`, when no token of it is valid
  // any more. Returns once no TCP write of it can land another byte (a shared-memory write
  // of it still in flight keeps its range busy until it is done: a deferred end, counted,
  // never waited for), with what its last write
  // landed if that write is the last change to the range made through this table (see
  // EndWrite); nullopt if none did (nothing, part or several writes landed, or the bytes came
  // by shared memory or RDMA, which this table does not see).
  std::optional<Landed> End(uint64_t grant, bool writes_only, absl::Time until)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The next term's secret, told to a master that has accepted this segment's mount: READ
  // tokens under it verify from now on, besides every token of the current term (cached
  // locations), so that master can serve reads as soon as it knows the segment's objects.
  // Nothing but reads verifies under it before NewTerm(next_secret): no write of the next
  // term lands while one of the current term still can. A later PrepareTerm replaces it.
  void PrepareTerm(std::string next_secret) ABSL_LOCKS_EXCLUDED(mu_);
  // A new term: tokens verify under `secret` only from now on, and every write in flight
  // ends, as does every read in flight but those already verified under `secret` (by
  // PrepareTerm). Returns once no TCP write can land another byte (shared-memory writes in
  // flight keep their ranges busy until done, as for End).
  void NewTerm(std::string secret) ABSL_LOCKS_EXCLUDED(mu_);

  std::string secret() const ABSL_LOCKS_EXCLUDED(mu_);
  // Ended grants remembered now, and writes in flight.
  size_t ended_count() const ABSL_LOCKS_EXCLUDED(mu_);
  size_t writes_in_flight() const ABSL_LOCKS_EXCLUDED(mu_);
  size_t reads_in_flight() const ABSL_LOCKS_EXCLUDED(mu_);
  // Reads cut because their grant ended, their entry left the manifest or a new term began
  // while they were being sent (not those whose bytes had all left the pool by then).
  uint64_t reads_cut() const ABSL_LOCKS_EXCLUDED(mu_);
  // Grants with a write begun and not yet ended by End.
  size_t grants_written() const ABSL_LOCKS_EXCLUDED(mu_);
  // Ended grants forgotten before their tokens expired because the table was full.
  uint64_t ended_overflowed() const ABSL_LOCKS_EXCLUDED(mu_);
  // Shared-memory writes (intents): begun, refused at begin (any reason), in flight now.
  uint64_t shm_writes_begun() const ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t shm_writes_refused() const ABSL_LOCKS_EXCLUDED(mu_);
  size_t shm_writes_in_flight() const ABSL_LOCKS_EXCLUDED(mu_);
  // Writes (any kind) refused because their range was busy with another grant's
  // shared-memory write; ends (End, NewTerm) that found a shared-memory write of the grant in
  // flight and left its range busy; bytes held busy now by such writes of ended grants.
  uint64_t busy_refused() const ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t deferred_ends() const ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t busy_bytes() const ABSL_LOCKS_EXCLUDED(mu_);
  // The ranges held busy now, for the master's allocator to keep out of (its heartbeat's
  // report, docs/semantics.md "Grants"): those of shared-memory writes in flight whose grant
  // has ended or whose term has passed, or, with `every_shm_write` (a mount on a master that
  // knows none of this table's grants), of every shared-memory write in flight. Coalesced
  // into at most wire::kMaxBusyRanges ranges, covering every busy byte.
  std::vector<wire::ByteRange> BusyRanges(bool every_shm_write = false) const
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // An ended grant, packed into 8 bytes: when its last token expires (Unix milliseconds,
  // rounded up) and whether only its writes ended.
  struct Ended {
    uint64_t bits = 0;
    Ended(int64_t until_ms, bool writes_only)
        : bits(static_cast<uint64_t>(until_ms) << 1 | (writes_only ? 1 : 0)) {}
    int64_t until_ms() const { return static_cast<int64_t>(bits >> 1); }
    bool writes_only() const { return (bits & 1) != 0; }
  };
  // `next_term`, if given, says whether the token verified under next_secret_.
  absl::Status CheckLocked(const wire::RequestHeader& request, absl::Time now,
                           bool* next_term = nullptr) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Forgets the ended grants whose tokens all expired (the earliest expiries first).
  void PruneLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Past the cap: forgets the quarter with the earliest expiries, and refuses tokens expiring
  // no later than they do.
  void ForgetEarliestLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops the grants of expiry_'s first bucket that still expire then (an End that moved a
  // grant's expiry later left it in its earlier bucket too); how many.
  size_t PopEarliestLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const bool require_token_;
  const size_t max_ended_;
  mutable absl::Mutex mu_;
  std::string secret_ ABSL_GUARDED_BY(mu_);
  wire::TokenKey key_ ABSL_GUARDED_BY(mu_);  // secret_'s
  std::string next_secret_ ABSL_GUARDED_BY(mu_);  // PrepareTerm's; empty: none
  wire::TokenKey next_key_ ABSL_GUARDED_BY(mu_);  // next_secret_'s
  absl::flat_hash_map<uint64_t, Ended> ended_ ABSL_GUARDED_BY(mu_);
  // The ended grants by when their tokens expire (Unix milliseconds): pruning and the cap
  // take them from the front, never scanning the whole table. expiry_entries_: grants in it.
  std::map<int64_t, std::vector<uint64_t>> expiry_ ABSL_GUARDED_BY(mu_);
  size_t expiry_entries_ ABSL_GUARDED_BY(mu_) = 0;
  std::unordered_multimap<uint64_t, std::shared_ptr<Write>> writes_ ABSL_GUARDED_BY(mu_);
  // Per grant written since it opened (until End): the last write begun, and what it landed.
  struct Written {
    uint64_t last_begun = 0;
    std::optional<Landed> landed;
  };
  absl::flat_hash_map<uint64_t, Written> written_ ABSL_GUARDED_BY(mu_);
  // Reads in flight, by id: their grant and how to cut them.
  struct InFlightRead {
    uint64_t grant = 0;  // 0 for a read by key
    Cut cut;
    bool next_term = false;  // verified under next_secret_: a grant of the next term
    // A read by key: the manifest entry's range.
    uint64_t key_offset = 0;
    uint64_t key_length = 0;
  };
  absl::flat_hash_map<uint64_t, InFlightRead> reads_ ABSL_GUARDED_BY(mu_);
  uint64_t next_read_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t reads_cut_ ABSL_GUARDED_BY(mu_) = 0;
  void CutReadsLocked(bool all, uint64_t grant) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint64_t next_write_seq_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t term_ ABSL_GUARDED_BY(mu_) = 0;  // NewTerm calls so far
  // Shared-memory writes in flight (also in writes_), by offset: a GPU store has hundreds in
  // flight, so a new write's overlap check looks only at those that can reach its range,
  // starting at most shm_max_length_ before it.
  std::multimap<uint64_t, Write*> shm_writes_ ABSL_GUARDED_BY(mu_);
  uint64_t shm_max_length_ ABSL_GUARDED_BY(mu_) = 0;  // since shm_writes_ was last empty
  uint64_t shm_begun_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t shm_refused_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t busy_refused_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t deferred_ends_ ABSL_GUARDED_BY(mu_) = 0;
  // Tokens expiring at or before this are refused (grants forgotten past the cap).
  absl::Time refused_through_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  uint64_t overflowed_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace kvpool::segment
