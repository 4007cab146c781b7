#include "engine_plugin/kv_receiver.h"

#include "engine_plugin/testing/fake_store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvpool::engine {
namespace {

using ::testing::ElementsAre;
using ::testing::UnorderedElementsAre;
using testing::FakeStore;

constexpr uint32_t kBlockSize = 16;
constexpr uint64_t kKBytes = 64;   // segment 0 (K) bytes per block
constexpr uint64_t kVBytes = 128;  // segment 1 (V) bytes per block
constexpr uint64_t kBlocks = 8;

class KvReceiverTest : public ::testing::Test {
 protected:
  KvReceiverTest()
      : k_(kBlocks * kKBytes, 0), v_(kBlocks * kVBytes, 0),
        db_(KeyMetadata{.model_name = "m"}, kBlockSize) {
    absl::StatusOr<KvCacheLayout> layout = KvCacheLayout::FromSegments(
        {{reinterpret_cast<uint64_t>(k_.data()), kKBytes},
         {reinterpret_cast<uint64_t>(v_.data()), kVBytes}},
        kBlocks, kBlockSize);
    EXPECT_TRUE(layout.ok());
    EXPECT_TRUE(db_.SetLayout(*layout).ok());
    for (int i = 0; i < 4; ++i) {
      store_.Set(db_.KeyFor("h" + std::to_string(i)),
                 std::string(kKBytes + kVBytes, static_cast<char>('a' + i)));
    }
  }

  static ReqMeta Load(uint64_t token_len, uint64_t engine_cached, std::vector<int64_t> block_ids,
                      std::vector<std::string> hashes) {
    ReqMeta r;
    r.req_id = "req";
    r.block_ids = std::move(block_ids);
    r.block_hashes = std::move(hashes);
    r.load_spec = LoadSpec{.vllm_cached_tokens = engine_cached,
                           .kvpool_cached_tokens = token_len,
                           .can_load = true,
                           .token_len = token_len};
    return r;
  }

  std::vector<uint8_t> k_;
  std::vector<uint8_t> v_;
  TokenDatabase db_;
  FakeStore store_;
};

TEST_F(KvReceiverTest, LoadsChunksIntoTheirBlocksPastTheEngineCache) {
  KvReceiver receiver(store_, db_, {});
  // 64 tokens, the engine has the first 20 (one whole block): chunks 1..3 into blocks 6, 2, 4.
  receiver.HandleRequest(Load(64, 20, {7, 6, 2, 4}, {"h0", "h1", "h2", "h3"}));
  EXPECT_THAT(receiver.TakeFinished(), UnorderedElementsAre("req"));
  EXPECT_EQ(k_[6 * kKBytes], 'b');
  EXPECT_EQ(v_[6 * kVBytes + kVBytes - 1], 'b');
  EXPECT_EQ(k_[2 * kKBytes], 'c');
  EXPECT_EQ(v_[4 * kVBytes], 'd');
  EXPECT_EQ(k_[7 * kKBytes], 0);  // block of the engine-cached chunk untouched
  EXPECT_EQ(receiver.stats().keys_loaded, 3u);
  EXPECT_EQ(receiver.stats().bytes_loaded, 3 * (kKBytes + kVBytes));
  EXPECT_TRUE(receiver.TakeFinished().empty());
}

// A host cache's layer-wise load is done at StartLayerwise (one get for every request of the
// step); FinishLayerwise reports each request with its own failed blocks.
TEST_F(KvReceiverTest, LayerwiseLoadsOfAHostCacheLoadAtStartAndReportAtFinish) {
  KvReceiver receiver(store_, db_, {});
  ReqMeta a = Load(32, 0, {3, 5}, {"h0", "h1"});
  a.req_id = "a";
  ReqMeta b = Load(32, 0, {6, 1}, {"missing", "h3"});
  b.req_id = "b";
  receiver.StartLayerwise({a, b});
  EXPECT_EQ(store_.get_calls(), 1);
  EXPECT_EQ(k_[3 * kKBytes], 'a');
  EXPECT_EQ(v_[1 * kVBytes], 'd');
  EXPECT_TRUE(receiver.WaitForLayer(7, 0).ok());
  EXPECT_EQ(receiver.WaitForLayer(-1, 0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(receiver.TakeFinished().empty()) << "reported before FinishLayerwise";
  receiver.FinishLayerwise();
  EXPECT_THAT(receiver.TakeFinished(), UnorderedElementsAre("a", "b"));
  EXPECT_THAT(receiver.TakeFailedBlockIds(), UnorderedElementsAre(6));
  EXPECT_EQ(receiver.stats().keys_loaded, 3u);
  receiver.FinishLayerwise();  // nothing left
  EXPECT_TRUE(receiver.TakeFinished().empty());
}

TEST_F(KvReceiverTest, RotatesTheBatchByRank) {
  KvReceiver receiver(store_, db_, {.tp_rank = 4});
  receiver.HandleRequest(Load(48, 0, {0, 1, 2}, {"h0", "h1", "h2"}));
  ASSERT_EQ(store_.get_calls(), 1);
  EXPECT_THAT(store_.get_keys()[0],
              ElementsAre(db_.KeyFor("h1"), db_.KeyFor("h2"), db_.KeyFor("h0")));  // 4 % 3 = 1
}

TEST_F(KvReceiverTest, ReportsFinishedAndFailedBlocksWhenKeysAreMissing) {
  KvReceiver receiver(store_, db_, {});
  receiver.HandleRequest(Load(48, 0, {0, 1, 5}, {"h0", "missing", "h2"}));
  EXPECT_THAT(receiver.TakeFinished(), UnorderedElementsAre("req"));
  EXPECT_THAT(receiver.TakeFailedBlockIds(), UnorderedElementsAre(1));
  EXPECT_EQ(receiver.stats().keys_failed, 1u);
  EXPECT_TRUE(receiver.TakeFailedBlockIds().empty());
}

TEST_F(KvReceiverTest, NothingToLoadStillFinishes) {
  KvReceiver receiver(store_, db_, {});
  receiver.HandleRequest(Load(32, 32, {0, 1}, {"h0", "h1"}));
  EXPECT_EQ(store_.get_calls(), 0);
  EXPECT_THAT(receiver.TakeFinished(), UnorderedElementsAre("req"));
}

TEST_F(KvReceiverTest, ThreadHandlesQueuedLoads) {
  KvReceiver receiver(store_, db_, {});
  receiver.Start();
  ReqMeta a = Load(32, 0, {0, 1}, {"h0", "h1"});
  ReqMeta b = Load(16, 0, {3}, {"h3"});
  b.req_id = "other";
  receiver.Enqueue(a);
  receiver.Enqueue(b);
  receiver.WaitIdle();
  EXPECT_THAT(receiver.TakeFinished(), UnorderedElementsAre("req", "other"));
  EXPECT_EQ(k_[3 * kKBytes], 'd');
  receiver.Stop();
}

}  // namespace
}  // namespace kvpool::engine
