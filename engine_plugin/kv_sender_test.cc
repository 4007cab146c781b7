#include "engine_plugin/kv_sender.h"

#include <atomic>
#include <numeric>

#include "engine_plugin/notified_ready_event.h"
#include "engine_plugin/testing/fake_store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvpool::engine {
namespace {

using ::testing::ElementsAre;
using testing::FakeStore;

constexpr uint32_t kBlockSize = 16;
constexpr uint64_t kBlockBytes = 256;
constexpr uint64_t kBlocks = 8;

// A sender over one 256-byte-per-block segment of a real buffer, as in the seed's tests
// (test-model, tp 0, block size 16, block_len 256).
class KvSenderTest : public ::testing::Test {
 protected:
  KvSenderTest()
      : cache_(kBlocks * kBlockBytes),
        db_(KeyMetadata{.model_name = "test-model"}, kBlockSize) {
    std::iota(cache_.begin(), cache_.end(), 0);
    absl::StatusOr<KvCacheLayout> layout = KvCacheLayout::FromSegments(
        {{reinterpret_cast<uint64_t>(cache_.data()), kBlockBytes}}, kBlocks, kBlockSize);
    EXPECT_TRUE(layout.ok());
    EXPECT_TRUE(db_.SetLayout(*layout).ok());
  }

  static ReqMeta Request(const std::string& id, std::vector<std::string> hashes,
                         std::vector<int64_t> block_ids = {0, 1}) {
    ReqMeta r;
    r.req_id = id;
    r.token_len_chunk = hashes.size() * kBlockSize;
    r.block_ids = std::move(block_ids);
    r.block_hashes = std::move(hashes);
    r.can_save = true;
    return r;
  }

  // Stores a request the way GetFinished does: one more pending job, then the request.
  void Store(KvSender& sender, const ReqMeta& request) {
    sender.AddStoredRequest(request.req_id);
    sender.HandleRequest(request);
  }

  std::string Key(const std::string& hash) { return db_.KeyFor(hash); }

  std::vector<uint8_t> cache_;
  TokenDatabase db_;
  FakeStore store_;
};

absl::Status NoSpace() { return absl::ResourceExhaustedError("NO_AVAILABLE_HANDLE"); }

TEST_F(KvSenderTest, PressureSkipsThenClearsThenResumes) {
  KvSender sender(store_, db_, {});
  store_.ScriptPut({NoSpace(), NoSpace()});
  store_.ScriptPut({absl::OkStatus(), absl::OkStatus()});
  store_.ScriptPut({absl::OkStatus(), absl::OkStatus()});

  // A batch refused for lack of space marks the pool under pressure and the request skipped.
  Store(sender, Request("req-a", {"a0", "a1"}));
  EXPECT_TRUE(sender.store_pressure_active());
  EXPECT_TRUE(sender.IsSkippedForPressure("req-a"));
  EXPECT_EQ(store_.put_calls(), 1);

  // The same request's next store is skipped without touching the store.
  Store(sender, Request("req-a", {"a2", "a3"}));
  EXPECT_EQ(store_.put_calls(), 1);
  EXPECT_EQ(store_.exist_calls(), 1);
  EXPECT_EQ(sender.PendingJobs("req-a"), 0);

  // Another request still stores; its success clears the pressure.
  Store(sender, Request("req-b", {"b0", "b1"}));
  EXPECT_FALSE(sender.store_pressure_active());
  EXPECT_FALSE(sender.IsSkippedForPressure("req-a"));
  EXPECT_EQ(store_.put_calls(), 2);

  // And the first request resumes.
  Store(sender, Request("req-a", {"a4", "a5"}));
  EXPECT_EQ(store_.put_calls(), 3);
  EXPECT_THAT(store_.put_keys().back(), ElementsAre(Key("a4"), Key("a5")));
  EXPECT_EQ(sender.stats().skipped_for_pressure, 1u);
  EXPECT_EQ(sender.stats().keys_no_space, 2u);
}

TEST_F(KvSenderTest, OnlyNoAvailableHandleTriggersTheBackOff) {
  KvSender sender(store_, db_, {});
  store_.ScriptPut({absl::UnavailableError("transfer failed"), absl::InternalError("-500")});
  Store(sender, Request("req-a", {"a0", "a1"}));
  EXPECT_FALSE(sender.store_pressure_active());
  EXPECT_FALSE(sender.IsSkippedForPressure("req-a"));
  EXPECT_EQ(store_.put_calls(), 1);

  Store(sender, Request("req-a", {"a2", "a3"}));
  EXPECT_EQ(store_.put_calls(), 2);
  EXPECT_EQ(sender.stats().keys_failed, 2u);
}

TEST_F(KvSenderTest, OneNoSpaceKeyMarksAndOtherFailuresDoNotClear) {
  KvSender sender(store_, db_, {});
  store_.ScriptPut({absl::OkStatus(), NoSpace()});
  Store(sender, Request("req-a", {"a0", "a1"}));
  EXPECT_TRUE(sender.store_pressure_active());

  // A batch that fails for another reason neither clears the pressure nor marks req-c.
  store_.ScriptPut({absl::UnavailableError("rpc failed")});
  Store(sender, Request("req-c", {"c0"}));
  EXPECT_TRUE(sender.store_pressure_active());
  EXPECT_TRUE(sender.IsSkippedForPressure("req-a"));
  EXPECT_FALSE(sender.IsSkippedForPressure("req-c"));

  Store(sender, Request("req-a", {"a2"}));
  EXPECT_EQ(store_.put_calls(), 2);  // still skipped

  // Forgetting a finished request drops its mark too.
  sender.DeleteFinishedStoredRequest("req-a");
  EXPECT_FALSE(sender.IsSkippedForPressure("req-a"));
}

TEST_F(KvSenderTest, AlreadyStoredByAnotherWriterCountsAsSuccess) {
  KvSender sender(store_, db_, {});
  store_.ScriptPut({NoSpace()});
  Store(sender, Request("req-a", {"a0"}));
  ASSERT_TRUE(sender.store_pressure_active());
  store_.ScriptPut({absl::AlreadyExistsError("raced")});
  Store(sender, Request("req-b", {"b0"}));
  EXPECT_FALSE(sender.store_pressure_active());
}

TEST_F(KvSenderTest, StoresOnlyWhatThePoolDoesNotHave) {
  KvSender sender(store_, db_, {});
  Store(sender, Request("req-a", {"h0", "h1", "h2"}, {3, 5, 6}));
  ASSERT_EQ(store_.put_calls(), 1);
  // The value of chunk 1 is block 5 of the cache.
  std::string expected(reinterpret_cast<const char*>(cache_.data()) + 5 * kBlockBytes,
                       kBlockBytes);
  EXPECT_EQ(store_.Value(Key("h1")), expected);
  EXPECT_EQ(sender.stats().bytes_stored, 3 * kBlockBytes);

  // The same chunks again: checked, found, nothing sent.
  Store(sender, Request("req-b", {"h0", "h1", "h2"}, {3, 5, 6}));
  EXPECT_EQ(store_.put_calls(), 1);
  EXPECT_EQ(store_.exist_calls(), 2);
  EXPECT_EQ(sender.stats().keys_present, 3u);
  EXPECT_EQ(sender.stats().bytes_stored, 3 * kBlockBytes);

  // A longer prefix sends only the new chunk.
  Store(sender, Request("req-c", {"h0", "h1", "h2", "h3"}, {3, 5, 6, 7}));
  EXPECT_EQ(store_.put_calls(), 2);
  EXPECT_THAT(store_.put_keys().back(), ElementsAre(Key("h3")));
}

TEST_F(KvSenderTest, TensorParallelRanksStrideOverChunks) {
  KvSender sender(store_, db_, {.tp_rank = 3, .put_step = 2});
  Store(sender, Request("req-a", {"h0", "h1", "h2", "h3", "h4"}, {0, 1, 2, 3, 4}));
  ASSERT_EQ(store_.put_calls(), 1);
  EXPECT_THAT(store_.exist_keys()[0], ElementsAre(Key("h1"), Key("h3")));
  EXPECT_THAT(store_.put_keys()[0], ElementsAre(Key("h1"), Key("h3")));
}

TEST_F(KvSenderTest, DropsRequestsNoLongerOnRecord) {
  KvSender sender(store_, db_, {});
  sender.HandleRequest(Request("gone", {"h0"}));  // never added, or deleted since
  EXPECT_EQ(store_.exist_calls(), 0);
  EXPECT_EQ(sender.PendingJobs("gone"), std::nullopt);
}

TEST_F(KvSenderTest, WaitsForTheReadyEventBeforeReadingTheCache) {
  KvSender sender(store_, db_, {});
  auto ready = std::make_shared<NotifiedReadyEvent>();
  std::atomic<bool> put_before_ready{false};
  store_.OnPut([&] { put_before_ready = put_before_ready || !ready->HasBeenNotified(); });
  sender.Start();
  ReqMeta request = Request("req-a", {"h0"});
  request.ready_event = ready;
  sender.AddStoredRequest("req-a");
  sender.Enqueue(request);
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(store_.put_calls(), 0);
  ready->Notify();
  sender.WaitIdle();
  EXPECT_EQ(store_.put_calls(), 1);
  EXPECT_FALSE(put_before_ready);
  EXPECT_EQ(sender.PendingJobs("req-a"), 0);
  sender.Stop();
}

class FailedEvent : public ReadyEvent {
 public:
  absl::Status Wait() override { return absl::InternalError("device lost"); }
};

TEST_F(KvSenderTest, AFailedReadyEventSkipsTheStore) {
  KvSender sender(store_, db_, {});
  ReqMeta request = Request("req-a", {"h0"});
  request.ready_event = std::make_shared<FailedEvent>();
  Store(sender, request);
  EXPECT_EQ(store_.put_calls(), 0);
  EXPECT_EQ(sender.PendingJobs("req-a"), 0);
}

TEST_F(KvSenderTest, StopHandlesWhatIsQueued) {
  KvSender sender(store_, db_, {});
  sender.Start();
  for (int i = 0; i < 5; ++i) {
    ReqMeta request = Request("req-" + std::to_string(i), {"h" + std::to_string(i)});
    sender.AddStoredRequest(request.req_id);
    sender.Enqueue(request);
  }
  sender.Stop();
  EXPECT_EQ(store_.put_calls(), 5);
  EXPECT_EQ(sender.stats().requests, 5u);
}

}  // namespace
}  // namespace kvpool::engine
