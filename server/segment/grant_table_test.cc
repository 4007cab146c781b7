#include "server/segment/grant_table.h"

#include <atomic>
#include <thread>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "proto/capability.h"

namespace kvpool::segment {
namespace {

wire::RequestHeader Request(const std::string& secret, wire::Opcode opcode, uint64_t grant,
                            absl::Time expiry = absl::Now() + absl::Minutes(1)) {
  wire::RequestHeader header;
  header.opcode = opcode;
  header.offset = 4096;
  header.length = 512;
  header.token = wire::MintToken(secret, opcode, 4096, 512, expiry, grant);
  return header;
}

// A cut that counts its calls and answers whether it stopped a send.
GrantTable::Cut CountingCut(int& calls, bool stopped = true) {
  return [&calls, stopped] {
    ++calls;
    return stopped;
  };
}

TEST(GrantTableTest, EndedGrantsAreRefusedOthersServed) {
  std::string secret = wire::NewCapabilitySecret();
  GrantTable grants(secret);
  absl::Time now = absl::Now();
  ASSERT_TRUE(grants.CheckRead(Request(secret, wire::Opcode::kRead, 7), now).ok());
  ASSERT_TRUE(grants.BeginWrite(Request(secret, wire::Opcode::kWrite, 7), now).ok());

  // A commit ends the writes only: reads of the object go on.
  grants.End(7, /*writes_only=*/true, now + absl::Minutes(1));
  EXPECT_EQ(grants.BeginWrite(Request(secret, wire::Opcode::kWrite, 7), now).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(grants.CheckRead(Request(secret, wire::Opcode::kRead, 7), now).ok());
  // A remove ends it altogether.
  grants.End(7, /*writes_only=*/false, now + absl::Minutes(1));
  EXPECT_EQ(grants.CheckRead(Request(secret, wire::Opcode::kRead, 7), now).code(),
            absl::StatusCode::kFailedPrecondition);
  // A writes-only end after that does not reopen reads.
  grants.End(7, /*writes_only=*/true, now + absl::Minutes(1));
  EXPECT_FALSE(grants.CheckRead(Request(secret, wire::Opcode::kRead, 7), now).ok());
  // Other grants are untouched.
  EXPECT_TRUE(grants.CheckRead(Request(secret, wire::Opcode::kRead, 8), now).ok());
  EXPECT_TRUE(grants.BeginWrite(Request(secret, wire::Opcode::kWrite, 8), now).ok());
}

TEST(GrantTableTest, GrantIdIsBoundByTheMac) {
  std::string secret = wire::NewCapabilitySecret();
  GrantTable grants(secret);
  wire::RequestHeader request = Request(secret, wire::Opcode::kWrite, 7);
  grants.End(7, false, absl::Now() + absl::Minutes(1));
  // Rewriting the grant id of an ended grant's token does not get it past the table.
  request.token[8] ^= 1;
  EXPECT_EQ(grants.BeginWrite(request, absl::Now()).status().code(),
            absl::StatusCode::kPermissionDenied);
}

TEST(GrantTableTest, NewTermRefusesOldTokensAndEndsWritesInFlight) {
  std::string old_secret = wire::NewCapabilitySecret();
  GrantTable grants(old_secret);
  absl::StatusOr<std::shared_ptr<GrantTable::Write>> write =
      grants.BeginWrite(Request(old_secret, wire::Opcode::kWrite, 9), absl::Now());
  ASSERT_TRUE(write.ok());
  int landed = 0;
  EXPECT_TRUE((*write)->Land([&] { ++landed; }));

  std::string new_secret = wire::NewCapabilitySecret();
  grants.NewTerm(new_secret);
  EXPECT_FALSE((*write)->Land([&] { ++landed; }));
  EXPECT_EQ(landed, 1);
  EXPECT_EQ(grants.CheckRead(Request(old_secret, wire::Opcode::kRead, 9), absl::Now()).code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(grants.CheckRead(Request(new_secret, wire::Opcode::kRead, 9), absl::Now()).ok());
  grants.EndWrite(*write);
  EXPECT_EQ(grants.writes_in_flight(), 0u);
}

// Between a mount the master accepted and the manifest reported (MasterLink), reads of both
// terms verify, writes only of the old; NewTerm then keeps the new term's reads in flight.
TEST(GrantTableTest, APreparedTermVerifiesReadsOnlyUntilItBegins) {
  std::string old_secret = wire::NewCapabilitySecret();
  std::string new_secret = wire::NewCapabilitySecret();
  GrantTable grants(old_secret);
  absl::Time now = absl::Now();
  grants.PrepareTerm(new_secret);
  EXPECT_TRUE(grants.CheckRead(Request(old_secret, wire::Opcode::kRead, 3), now).ok());
  EXPECT_TRUE(grants.CheckRead(Request(new_secret, wire::Opcode::kRead, 3), now).ok());
  EXPECT_EQ(grants.BeginWrite(Request(new_secret, wire::Opcode::kWrite, 3), now).status().code(),
            absl::StatusCode::kPermissionDenied);
  absl::StatusOr<std::shared_ptr<GrantTable::Write>> old_write =
      grants.BeginWrite(Request(old_secret, wire::Opcode::kWrite, 4), now);
  ASSERT_TRUE(old_write.ok());
  // An old grant's end does not touch a new read with the same grant id.
  int old_cut = 0, new_cut = 0;
  absl::StatusOr<uint64_t> old_read =
      grants.BeginRead(Request(old_secret, wire::Opcode::kRead, 5), now, CountingCut(old_cut));
  absl::StatusOr<uint64_t> new_read =
      grants.BeginRead(Request(new_secret, wire::Opcode::kRead, 5), now, CountingCut(new_cut));
  ASSERT_TRUE(old_read.ok());
  ASSERT_TRUE(new_read.ok());
  grants.End(5, /*writes_only=*/false, now + absl::Minutes(1));
  EXPECT_EQ(old_cut, 1);
  EXPECT_EQ(new_cut, 0);
  absl::StatusOr<uint64_t> old_read_2 =
      grants.BeginRead(Request(old_secret, wire::Opcode::kRead, 6), now, CountingCut(old_cut));
  ASSERT_TRUE(old_read_2.ok());

  grants.NewTerm(new_secret);
  EXPECT_EQ(old_cut, 2);  // the old term's read in flight is cut
  EXPECT_EQ(new_cut, 0);  // the new one goes on
  EXPECT_EQ(grants.reads_in_flight(), 1u);
  EXPECT_FALSE((*old_write)->Land([] {}));
  EXPECT_EQ(grants.CheckRead(Request(old_secret, wire::Opcode::kRead, 3), now).code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(grants.BeginWrite(Request(new_secret, wire::Opcode::kWrite, 3), now).ok());
  // Of this term now: its grant's end cuts it.
  grants.End(5, /*writes_only=*/false, now + absl::Minutes(1));
  EXPECT_EQ(new_cut, 1);
  grants.EndWrite(*old_write);
}

// A prepared secret replaced before its term begins verifies nothing any more, and a term
// begun under another secret cuts the reads it had let in.
TEST(GrantTableTest, AReplacedPreparedTermVerifiesNothing) {
  std::string old_secret = wire::NewCapabilitySecret();
  std::string abandoned = wire::NewCapabilitySecret();
  std::string next = wire::NewCapabilitySecret();
  GrantTable grants(old_secret);
  absl::Time now = absl::Now();
  grants.PrepareTerm(abandoned);
  int cut = 0;
  ASSERT_TRUE(
      grants.BeginRead(Request(abandoned, wire::Opcode::kRead, 2), now, CountingCut(cut)).ok());
  grants.PrepareTerm(next);
  EXPECT_EQ(grants.CheckRead(Request(abandoned, wire::Opcode::kRead, 2), now).code(),
            absl::StatusCode::kPermissionDenied);
  grants.NewTerm(wire::NewCapabilitySecret());
  EXPECT_EQ(cut, 1);
  EXPECT_EQ(grants.CheckRead(Request(next, wire::Opcode::kRead, 2), now).code(),
            absl::StatusCode::kPermissionDenied);
}

// A read whose cut finds its bytes gone already (the cut returns false) ends without being
// counted as cut; one whose cut stopped it is counted. Both leave the table.
TEST(GrantTableTest, OnlyReadsWhoseSendWasStoppedCountAsCut) {
  std::string secret = wire::NewCapabilitySecret();
  GrantTable grants(secret);
  absl::Time now = absl::Now();
  int asked = 0;
  ASSERT_TRUE(grants
                  .BeginRead(Request(secret, wire::Opcode::kRead, 3), now,
                             CountingCut(asked, /*stopped=*/false))
                  .ok());
  uint64_t by_key = grants.BeginKeyRead(8192, 100, CountingCut(asked));
  EXPECT_GT(by_key, 0u);
  EXPECT_EQ(grants.reads_in_flight(), 2u);
  grants.End(3, /*writes_only=*/false, now + absl::Minutes(1));
  grants.CutKeyReads(8100, 100);
  EXPECT_EQ(asked, 2);
  EXPECT_EQ(grants.reads_in_flight(), 0u);
  EXPECT_EQ(grants.reads_cut(), 1u);
}

TEST(GrantTableTest, EndWaitsForALandInProgressAndStopsLaterOnes) {
  std::string secret = wire::NewCapabilitySecret();
  GrantTable grants(secret);
  std::shared_ptr<GrantTable::Write> write =
      *grants.BeginWrite(Request(secret, wire::Opcode::kWrite, 11), absl::Now());
  absl::Notification landing, release;
  std::atomic<bool> land_finished{false};
  std::thread writer([&] {
    write->Land([&] {
      landing.Notify();
      release.WaitForNotification();
      land_finished = true;
    });
  });
  landing.WaitForNotification();
  std::atomic<bool> ended{false};
  std::thread ender([&] {
    grants.End(11, /*writes_only=*/false, absl::Now() + absl::Minutes(1));
    // End returns only once the land in progress is over.
    EXPECT_TRUE(land_finished.load());
    ended = true;
  });
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_FALSE(ended.load());
  release.Notify();
  writer.join();
  ender.join();
  EXPECT_FALSE(write->Land([] { ADD_FAILURE() << "landed after its grant ended"; }));
}

TEST(GrantTableTest, AWriteWhoseTokenExpiresMidPayloadLandsNoMore) {
  std::string secret = wire::NewCapabilitySecret();
  GrantTable grants(secret);
  std::shared_ptr<GrantTable::Write> write = *grants.BeginWrite(
      Request(secret, wire::Opcode::kWrite, 12, absl::Now() + absl::Milliseconds(100)),
      absl::Now());
  EXPECT_TRUE(write->Land([] {}));
  absl::SleepFor(absl::Milliseconds(150));
  EXPECT_FALSE(write->Land([] { ADD_FAILURE() << "landed after its token expired"; }));
}

TEST(GrantTableTest, EndedGrantsArePrunedOnceTheirTokensExpired) {
  std::string secret = wire::NewCapabilitySecret();
  GrantTable grants(secret);
  absl::Time past = absl::Now() - absl::Minutes(1);
  // Far more ends than the pruning period, of grants whose tokens all expired: the table
  // does not grow with them.
  for (uint64_t grant = 1; grant <= 20000; ++grant) grants.End(grant, false, past);
  EXPECT_LT(grants.ended_count(), 4096u + 1);
  EXPECT_EQ(grants.ended_overflowed(), 0u);
  // Grants whose tokens are still live are kept.
  absl::Time future = absl::Now() + absl::Minutes(1);
  for (uint64_t grant = 100001; grant <= 100010; ++grant) grants.End(grant, false, future);
  for (uint64_t grant = 1; grant <= 10000; ++grant) grants.End(grant, false, past);
  EXPECT_GE(grants.ended_count(), 10u);
  EXPECT_EQ(grants.CheckRead(Request(secret, wire::Opcode::kRead, 100005, future), absl::Now())
                .code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(GrantTableTest, EndedGrantsAreCappedAndAForgottenGrantStaysEnded) {
  std::string secret = wire::NewCapabilitySecret();
  constexpr size_t kCap = 100;
  GrantTable grants(secret, /*require_token=*/true, kCap);
  absl::Time now = absl::Now();
  absl::Time base = now + absl::Minutes(1);
  auto until = [base](uint64_t grant) { return base + absl::Milliseconds(grant); };
  // Ten times the cap, all with live tokens (a commit rate beyond the cap per put timeout).
  for (uint64_t grant = 1; grant <= 10 * kCap; ++grant) {
    grants.End(grant, /*writes_only=*/false, until(grant));
    ASSERT_LE(grants.ended_count(), kCap);
  }
  EXPECT_GT(grants.ended_overflowed(), 0u);
  EXPECT_EQ(grants.ended_overflowed() + grants.ended_count(), 10 * kCap);
  // Every ended grant is still refused, forgotten or not: reads and writes.
  for (uint64_t grant = 1; grant <= 10 * kCap; ++grant) {
    EXPECT_EQ(grants.CheckRead(Request(secret, wire::Opcode::kRead, grant, until(grant)), now)
                  .code(),
              absl::StatusCode::kFailedPrecondition)
        << grant;
    EXPECT_EQ(grants.BeginWrite(Request(secret, wire::Opcode::kWrite, grant, until(grant)), now)
                  .status()
                  .code(),
              absl::StatusCode::kFailedPrecondition)
        << grant;
  }
  // An open grant whose token outlives the forgotten ones is served.
  uint64_t open = 10 * kCap + 1;
  EXPECT_TRUE(grants.CheckRead(Request(secret, wire::Opcode::kRead, open, until(open)), now).ok());
  EXPECT_TRUE(
      grants.BeginWrite(Request(secret, wire::Opcode::kWrite, open, until(open)), now).ok());
  // A new term starts with nothing refused.
  std::string next = wire::NewCapabilitySecret();
  grants.NewTerm(next);
  EXPECT_TRUE(grants.CheckRead(Request(next, wire::Opcode::kRead, 1, until(1)), now).ok());
}

// Ends out of expiry order (a commit's writes-only end, then the object's removal with a later
// read lease): a grant is remembered until its latest expiry, and the cap forgets the earliest
// expiries first, whatever order the ends came in.
TEST(GrantTableTest, EndedGrantsGoInOrderOfTheirLatestExpiry) {
  std::string secret = wire::NewCapabilitySecret();
  constexpr size_t kCap = 64;
  GrantTable grants(secret, /*require_token=*/true, kCap);
  const absl::Time now = absl::Now();
  const absl::Time past = now - absl::Minutes(1);
  // Grant 7: its writes ended long ago, its reads now, until a minute from now.
  grants.End(7, /*writes_only=*/true, past);
  grants.End(7, /*writes_only=*/false, now + absl::Minutes(1));
  // Expired ends prune the table as they come (grant 7's first expiry among them).
  for (uint64_t grant = 100; grant < 100 + 10 * kCap; ++grant) grants.End(grant, false, past);
  EXPECT_EQ(grants.ended_count(), 1u);
  EXPECT_EQ(grants.ended_overflowed(), 0u);
  const absl::Time lease = now + absl::Seconds(30);
  EXPECT_EQ(grants.CheckRead(Request(secret, wire::Opcode::kRead, 7, lease), now).code(),
            absl::StatusCode::kFailedPrecondition);
  // Live ends in descending order of expiry: past the cap, the earliest go first.
  auto until = [now](uint64_t grant) { return now + absl::Seconds(40) + absl::Seconds(grant); };
  for (uint64_t grant = 2 * kCap; grant >= 1; --grant)
    grants.End(1000 + grant, false, until(grant));
  EXPECT_LE(grants.ended_count(), kCap);
  EXPECT_GT(grants.ended_overflowed(), 0u);
  // Forgotten or not, every ended grant is refused; the latest expiries are still remembered;
  // a token of an open grant that outlives the forgotten ones is served.
  for (uint64_t grant = 1; grant <= 2 * kCap; ++grant) {
    EXPECT_EQ(
        grants.CheckRead(Request(secret, wire::Opcode::kRead, 1000 + grant, until(grant)), now)
            .code(),
        absl::StatusCode::kFailedPrecondition)
        << grant;
  }
  EXPECT_EQ(grants.CheckRead(Request(secret, wire::Opcode::kRead, 7, lease), now).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(
      grants.CheckRead(Request(secret, wire::Opcode::kRead, 5000, until(2 * kCap)), now).ok());
}

// An end whose tokens never expire (an infinite lease) is remembered through any number of
// expired ends; one before 1970 is pruned like any expired one.
TEST(GrantTableTest, AnEndUntilTheInfiniteFutureIsNeverPruned) {
  std::string secret = wire::NewCapabilitySecret();
  GrantTable grants(secret);
  const absl::Time now = absl::Now();
  grants.End(7, /*writes_only=*/false, absl::InfiniteFuture());
  grants.End(8, /*writes_only=*/false, absl::InfinitePast());
  for (uint64_t grant = 100; grant < 200; ++grant) grants.End(grant, false, now - absl::Hours(1));
  EXPECT_EQ(grants.ended_count(), 1u);
  EXPECT_EQ(grants.CheckRead(Request(secret, wire::Opcode::kRead, 7), now).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(grants.BeginWrite(Request(secret, wire::Opcode::kWrite, 7), now).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace kvpool::segment

namespace kvpool::segment {
namespace {

// A write that landed its whole payload leaves its checksum for the commit's End; anything
// that may have changed the range since (another write begun or still in flight, a write
// that did not land in full) leaves none, so the commit check hashes the range instead.
TEST(GrantTableLandedTest, OneWholeWriteHandsItsChecksumToTheCommit) {
  std::string secret = wire::NewCapabilitySecret();
  GrantTable grants(secret);
  absl::Time now = absl::Now();
  absl::Time until = now + absl::Minutes(1);
  const GrantTable::Landed landed{4096, 512, 0xfeed};

  auto write = grants.BeginWrite(Request(secret, wire::Opcode::kWrite, 11), now);
  ASSERT_TRUE(write.ok());
  grants.EndWrite(*write, landed);
  std::optional<GrantTable::Landed> got = grants.End(11, /*writes_only=*/true, until);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->offset, 4096u);
  EXPECT_EQ(got->length, 512u);
  EXPECT_EQ(got->checksum, 0xfeedu);
  // Handed out once: a second End (the FORGET of a later remove) gets nothing.
  EXPECT_FALSE(grants.End(11, /*writes_only=*/false, until).has_value());
  EXPECT_EQ(grants.grants_written(), 0u);
}

TEST(GrantTableLandedTest, AWriteThatDidNotLandInFullLeavesNothing) {
  std::string secret = wire::NewCapabilitySecret();
  GrantTable grants(secret);
  absl::Time now = absl::Now();
  auto whole = grants.BeginWrite(Request(secret, wire::Opcode::kWrite, 12), now);
  grants.EndWrite(*whole, GrantTable::Landed{4096, 512, 1});
  // A second write of the same grant, cut off mid-payload: the range is no longer what the
  // first one hashed.
  auto partial = grants.BeginWrite(Request(secret, wire::Opcode::kWrite, 12), now);
  grants.EndWrite(*partial);
  EXPECT_FALSE(grants.End(12, true, now + absl::Minutes(1)).has_value());
}

TEST(GrantTableLandedTest, OverlappingWritesOfOneGrantLeaveNothing) {
  std::string secret = wire::NewCapabilitySecret();
  GrantTable grants(secret);
  absl::Time now = absl::Now();
  // The first write ends after the second began and ended: either may have landed last.
  auto first = grants.BeginWrite(Request(secret, wire::Opcode::kWrite, 13), now);
  auto second = grants.BeginWrite(Request(secret, wire::Opcode::kWrite, 13), now);
  grants.EndWrite(*second, GrantTable::Landed{4096, 512, 2});
  grants.EndWrite(*first, GrantTable::Landed{4096, 512, 1});
  EXPECT_FALSE(grants.End(13, true, now + absl::Minutes(1)).has_value());
  // The second ends last, but the first was still in flight when it did.
  first = grants.BeginWrite(Request(secret, wire::Opcode::kWrite, 14), now);
  second = grants.BeginWrite(Request(secret, wire::Opcode::kWrite, 14), now);
  grants.EndWrite(*first, GrantTable::Landed{4096, 512, 1});
  grants.EndWrite(*second, GrantTable::Landed{4096, 512, 2});
  EXPECT_FALSE(grants.End(14, true, now + absl::Minutes(1)).has_value());
  // One after the other: the last one's checksum.
  first = grants.BeginWrite(Request(secret, wire::Opcode::kWrite, 15), now);
  grants.EndWrite(*first, GrantTable::Landed{4096, 512, 1});
  second = grants.BeginWrite(Request(secret, wire::Opcode::kWrite, 15), now);
  grants.EndWrite(*second, GrantTable::Landed{4096, 512, 2});
  std::optional<GrantTable::Landed> got = grants.End(15, true, now + absl::Minutes(1));
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->checksum, 2u);
}

TEST(GrantTableLandedTest, AWriteEndingAfterItsGrantEndedOrANewTermLeavesNothing) {
  std::string secret = wire::NewCapabilitySecret();
  GrantTable grants(secret);
  absl::Time now = absl::Now();
  // Still in flight at the commit: nothing to hand over, and nothing kept after it.
  auto late = grants.BeginWrite(Request(secret, wire::Opcode::kWrite, 16), now);
  EXPECT_FALSE(grants.End(16, true, now + absl::Minutes(1)).has_value());
  grants.EndWrite(*late, GrantTable::Landed{4096, 512, 3});
  EXPECT_EQ(grants.grants_written(), 0u);
  // A new term forgets what landed under the old one.
  auto old = grants.BeginWrite(Request(secret, wire::Opcode::kWrite, 17), now);
  grants.EndWrite(*old, GrantTable::Landed{4096, 512, 4});
  grants.NewTerm(wire::NewCapabilitySecret());
  EXPECT_FALSE(grants.End(17, true, now + absl::Minutes(1)).has_value());
}

// Shared-memory writes (write intents): the segment cannot cut a memcpy, so an intent in
// flight holds its range against every other grant's writes until it is done.
wire::RequestHeader RangeRequest(const std::string& secret, uint64_t grant, uint64_t offset,
                                 uint64_t length) {
  wire::RequestHeader header;
  header.opcode = wire::Opcode::kWrite;
  header.offset = offset;
  header.length = length;
  header.token = wire::MintToken(secret, wire::Opcode::kWrite, offset, length,
                                 absl::Now() + absl::Minutes(1), grant);
  return header;
}

TEST(GrantTableShmTest, AnIntentOfAnEndedGrantHoldsItsRangeUntilDone) {
  std::string secret = wire::NewCapabilitySecret();
  GrantTable grants(secret);
  absl::Time now = absl::Now();
  auto intent = grants.BeginWrite(RangeRequest(secret, 7, 4096, 512), now,
                                  GrantTable::WriteKind::kShm);
  ASSERT_TRUE(intent.ok()) << intent.status();
  EXPECT_EQ(grants.shm_writes_in_flight(), 1u);
  // The master reclaims grant 7 and hands part of its range to grant 8: End does not wait
  // for the intent (it cannot be cut), and the range stays busy.
  // Before the end the range is its open grant's (the master has it allocated): not busy
  // for the heartbeat's report, but busy for a mount's (a new master knows no grant of it).
  EXPECT_TRUE(grants.BusyRanges().empty());
  EXPECT_EQ(grants.BusyRanges(/*every_shm_write=*/true),
            (std::vector<wire::ByteRange>{{4096, 512}}));
  grants.End(7, /*writes_only=*/false, now + absl::Minutes(1));
  EXPECT_EQ(grants.deferred_ends(), 1u);
  EXPECT_EQ(grants.busy_bytes(), 512u);
  EXPECT_EQ(grants.BusyRanges(), (std::vector<wire::ByteRange>{{4096, 512}}));
  EXPECT_EQ(grants.BeginWrite(RangeRequest(secret, 8, 4096 + 256, 4096), now).status().code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(grants.BeginWrite(RangeRequest(secret, 8, 0, 4097), now,
                              GrantTable::WriteKind::kShm).status().code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(grants.busy_refused(), 2u);
  // Next to the range, writes go on.
  EXPECT_TRUE(grants.BeginWrite(RangeRequest(secret, 9, 4096 + 512, 512), now).ok());
  EXPECT_TRUE(grants.BeginWrite(RangeRequest(secret, 10, 0, 4096), now).ok());
  // Grant 7's writer wakes: a new intent of the ended grant is refused.
  EXPECT_EQ(grants.BeginWrite(RangeRequest(secret, 7, 4096, 512), now,
                              GrantTable::WriteKind::kShm).status().code(),
            absl::StatusCode::kFailedPrecondition);
  // Its intent done (or its connection closed), the range is free for grant 8.
  grants.EndWrite(*intent, GrantTable::Landed{4096, 512, 0, /*hashed=*/false});
  EXPECT_EQ(grants.busy_bytes(), 0u);
  EXPECT_TRUE(grants.BusyRanges().empty());
  EXPECT_TRUE(grants.BusyRanges(/*every_shm_write=*/true).empty());
  EXPECT_EQ(grants.shm_writes_in_flight(), 0u);
  EXPECT_TRUE(grants.BeginWrite(RangeRequest(secret, 8, 4096 + 256, 4096), now).ok());
  EXPECT_EQ(grants.shm_writes_begun(), 1u);
  EXPECT_EQ(grants.shm_writes_refused(), 2u);
}

// Many intents in flight (a GPU store's batch): a write is refused over any of them, a
// long one that starts far before it included, and accepted between them.
TEST(GrantTableShmTest, ManyIntentsInFlightEachHoldItsOwnRange) {
  std::string secret = wire::NewCapabilitySecret();
  GrantTable grants(secret);
  absl::Time now = absl::Now();
  constexpr uint64_t kLong = 1 << 20;
  std::vector<std::shared_ptr<GrantTable::Write>> intents;
  // One long intent at 0, then 256 of 4 KiB with 4 KiB gaps after it.
  auto begin = [&](uint64_t grant, uint64_t offset, uint64_t length) {
    return grants.BeginWrite(RangeRequest(secret, grant, offset, length), now,
                             GrantTable::WriteKind::kShm);
  };
  intents.push_back(*begin(1, 0, kLong));
  for (uint64_t i = 0; i < 256; ++i) intents.push_back(*begin(100 + i, kLong + i * 8192, 4096));
  EXPECT_EQ(grants.shm_writes_in_flight(), 257u);
  const auto code = [&](uint64_t grant, uint64_t offset, uint64_t length) {
    return begin(grant, offset, length).status().code();
  };
  // Inside the long one, near its end (it begins 1 MiB earlier), and across its end.
  EXPECT_EQ(code(2, kLong - 8, 4), absl::StatusCode::kUnavailable);
  EXPECT_EQ(code(2, kLong - 8, 16), absl::StatusCode::kUnavailable);
  // Over a short one, over its last byte, and over two of them.
  EXPECT_EQ(code(3, kLong + 100 * 8192 + 4095, 1), absl::StatusCode::kUnavailable);
  EXPECT_EQ(code(3, kLong + 100 * 8192 - 1, 2), absl::StatusCode::kUnavailable);
  EXPECT_EQ(code(3, kLong + 4096, 8192), absl::StatusCode::kUnavailable);
  // In a gap, and the same grant over its own range.
  EXPECT_EQ(code(4, kLong + 100 * 8192 + 4096, 4096), absl::StatusCode::kOk);
  EXPECT_EQ(code(100, kLong, 4096), absl::StatusCode::kOk);
  // Done, the long one's range is free.
  grants.EndWrite(intents[0], std::nullopt);
  EXPECT_EQ(code(2, kLong - 8, 4), absl::StatusCode::kOk);
}

TEST(GrantTableShmTest, AnIntentOfAnEarlierTermHoldsItsRangeAgainstTheSameGrantNumber) {
  std::string old_secret = wire::NewCapabilitySecret();
  GrantTable grants(old_secret);
  absl::Time now = absl::Now();
  auto intent = grants.BeginWrite(RangeRequest(old_secret, 5, 0, 1024), now,
                                  GrantTable::WriteKind::kShm);
  ASSERT_TRUE(intent.ok());
  // A new leader (new term) reuses the range, even under the same grant number.
  std::string new_secret = wire::NewCapabilitySecret();
  grants.NewTerm(new_secret);
  EXPECT_EQ(grants.deferred_ends(), 1u);
  EXPECT_EQ(grants.busy_bytes(), 1024u);
  EXPECT_EQ(grants.BusyRanges(), (std::vector<wire::ByteRange>{{0, 1024}}));
  EXPECT_EQ(grants.BeginWrite(RangeRequest(new_secret, 5, 0, 1024), now).status().code(),
            absl::StatusCode::kUnavailable);
  // The old writer's late done leaves nothing for the new grant's commit.
  grants.EndWrite(*intent, GrantTable::Landed{0, 1024, 0, /*hashed=*/false});
  EXPECT_EQ(grants.busy_bytes(), 0u);
  EXPECT_FALSE(grants.End(5, /*writes_only=*/true, now + absl::Minutes(1)).has_value());
  EXPECT_TRUE(grants.BeginWrite(RangeRequest(new_secret, 6, 0, 1024), now).ok());
}

TEST(GrantTableShmTest, ADoneIntentOverItsWholeRangeHandsTheRangeToTheCommit) {
  std::string secret = wire::NewCapabilitySecret();
  GrantTable grants(secret);
  absl::Time now = absl::Now();
  auto intent = grants.BeginWrite(RangeRequest(secret, 3, 8192, 4096), now,
                                  GrantTable::WriteKind::kShm);
  ASSERT_TRUE(intent.ok());
  // Its own grant may write the range again (a retry), another grant may not.
  grants.EndWrite(*intent, GrantTable::Landed{8192, 4096, 0, /*hashed=*/false});
  std::optional<GrantTable::Landed> landed = grants.End(3, true, now + absl::Minutes(1));
  ASSERT_TRUE(landed.has_value());
  EXPECT_EQ(landed->offset, 8192u);
  EXPECT_EQ(landed->length, 4096u);
  EXPECT_FALSE(landed->hashed);
  // An intent that was never done (its client went away) leaves nothing.
  auto gone = grants.BeginWrite(RangeRequest(secret, 4, 0, 4096), now,
                                GrantTable::WriteKind::kShm);
  ASSERT_TRUE(gone.ok());
  grants.EndWrite(*gone);
  EXPECT_FALSE(grants.End(4, true, now + absl::Minutes(1)).has_value());
  // An intent begun under an expired, forged or other term's token is refused.
  wire::RequestHeader expired = RangeRequest(secret, 6, 0, 64);
  expired.token = wire::MintToken(secret, wire::Opcode::kWrite, 0, 64,
                                  absl::Now() - absl::Seconds(1), 6);
  EXPECT_EQ(grants.BeginWrite(expired, now, GrantTable::WriteKind::kShm).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  wire::RequestHeader forged = RangeRequest(secret, 6, 0, 64);
  forged.length = 65;
  EXPECT_EQ(grants.BeginWrite(forged, now, GrantTable::WriteKind::kShm).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(grants.BeginWrite(RangeRequest(wire::NewCapabilitySecret(), 6, 0, 64), now,
                              GrantTable::WriteKind::kShm).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(grants.shm_writes_refused(), 3u);
}

// Many late writers: the report stays within its bound and covers every busy byte.
TEST(GrantTableShmTest, BusyRangesAreReportedWithinTheirBound) {
  std::string secret = wire::NewCapabilitySecret();
  GrantTable grants(secret);
  absl::Time now = absl::Now();
  std::vector<std::shared_ptr<GrantTable::Write>> intents;
  for (uint64_t i = 0; i < 200; ++i) {
    auto intent = grants.BeginWrite(RangeRequest(secret, 100 + i, i * 8192, 4096), now,
                                    GrantTable::WriteKind::kShm);
    ASSERT_TRUE(intent.ok()) << i;
    intents.push_back(*intent);
    grants.End(100 + i, /*writes_only=*/false, now + absl::Minutes(1));
  }
  std::vector<wire::ByteRange> busy = grants.BusyRanges();
  ASSERT_LE(busy.size(), wire::kMaxBusyRanges);
  ASSERT_FALSE(busy.empty());
  EXPECT_EQ(busy.front().offset, 0u);
  EXPECT_EQ(busy.back().end(), 199u * 8192 + 4096);
  for (uint64_t i = 0; i < 200; ++i) {
    bool covered = false;
    for (const wire::ByteRange& r : busy) covered |= r.offset <= i * 8192 && i * 8192 + 4096 <= r.end();
    EXPECT_TRUE(covered) << i;
  }
  for (const auto& intent : intents) grants.EndWrite(intent);
  EXPECT_TRUE(grants.BusyRanges().empty());
}

}  // namespace
}  // namespace kvpool::segment
