#include "engine_plugin/token_database.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvpool::engine {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

KeyMetadata Metadata() {
  return KeyMetadata{.model_name = "test-model", .tp_rank = 0, .pcp_rank = 0, .dcp_rank = 0,
                     .pp_rank = 0};
}

TEST(PoolKeyTest, MatchesMooncakeStoreConnectorFormat) {
  KeyMetadata m{.model_name = "Llama-3.1-8B", .tp_rank = 3, .pcp_rank = 1, .dcp_rank = 2,
                .pp_rank = 4};
  EXPECT_EQ(PoolKey(m, "deadbeef"), "Llama-3.1-8B@tp_rank:3@pcp1@dcp2@pp_rank:4@deadbeef");
  EXPECT_EQ(PoolKey(Metadata(), HexHash("a0")), "test-model@tp_rank:0@pcp0@dcp0@pp_rank:0@6130");
}

TEST(PoolKeyTest, HexAndModelName) {
  EXPECT_EQ(HexHash(std::string("\x00\xff\x10", 3)), "00ff10");
  EXPECT_EQ(ModelKeyName("meta-llama/Llama-3.1-8B-Instruct/"), "Llama-3.1-8B-Instruct");
  EXPECT_EQ(ModelKeyName("/models/qwen"), "qwen");
  EXPECT_EQ(ModelKeyName("plain"), "plain");
}

TEST(TokenDatabaseTest, ProcessTokensYieldsChunksWithKeys) {
  TokenDatabase db(Metadata(), 16);
  std::vector<std::string> hashes = {"h0", "h1", "h2", "h3"};
  std::vector<TokenChunk> chunks = db.ProcessTokens(40, hashes);
  ASSERT_EQ(chunks.size(), 3u);  // [0,16) [16,32) [32,40); h3 starts past the tokens
  EXPECT_EQ(chunks[0].start, 0u);
  EXPECT_EQ(chunks[0].end, 16u);
  EXPECT_EQ(chunks[0].key, "test-model@tp_rank:0@pcp0@dcp0@pp_rank:0@h0");
  EXPECT_EQ(chunks[2].start, 32u);
  EXPECT_EQ(chunks[2].end, 40u);
  EXPECT_EQ(chunks[2].index, 2u);

  // Tokens cached in the engine are masked (whole chunks that start before the mask).
  chunks = db.ProcessTokens(64, hashes, /*mask_num=*/32);
  ASSERT_EQ(chunks.size(), 2u);
  EXPECT_EQ(chunks[0].start, 32u);
  EXPECT_EQ(chunks[0].key, "test-model@tp_rank:0@pcp0@dcp0@pp_rank:0@h2");
  EXPECT_EQ(db.ProcessTokens(64, {}).size(), 0u);
  EXPECT_EQ(db.ProcessTokens(0, hashes).size(), 0u);
}

TEST(TokenDatabaseTest, PrepareValueAddressesEverySegment) {
  TokenDatabase db(Metadata(), 16);
  absl::StatusOr<KvCacheLayout> layout =
      KvCacheLayout::FromSegments({{0x1000, 256}, {0x9000, 512}}, /*num_blocks=*/8, 16);
  ASSERT_TRUE(layout.ok());
  ASSERT_TRUE(db.SetLayout(*layout).ok());
  std::vector<int64_t> block_ids = {5, 2, 7};

  absl::StatusOr<ChunkBuffers> full = db.PrepareValue(16, 32, block_ids);
  ASSERT_TRUE(full.ok()) << full.status();
  EXPECT_EQ(full->block_id, 2);
  EXPECT_THAT(full->addrs, ElementsAre(0x1000 + 2 * 256, 0x9000 + 2 * 512));
  EXPECT_THAT(full->sizes, ElementsAre(256, 512));
  EXPECT_EQ(full->total_bytes(), 768u);

  // A partial last chunk covers the first tokens' share of each block.
  absl::StatusOr<ChunkBuffers> partial = db.PrepareValue(32, 36, block_ids);
  ASSERT_TRUE(partial.ok());
  EXPECT_THAT(partial->addrs, ElementsAre(0x1000 + 7 * 256, 0x9000 + 7 * 512));
  EXPECT_THAT(partial->sizes, ElementsAre(256 / 16 * 4, 512 / 16 * 4));

  EXPECT_THAT(db.PrepareValue(48, 64, block_ids).status().message(), HasSubstr("3 block ids"));
  EXPECT_THAT(db.PrepareValue(8, 24, block_ids).status().message(), HasSubstr("within one block"));
  std::vector<int64_t> bad_ids = {8};
  EXPECT_THAT(db.PrepareValue(0, 16, bad_ids).status().message(),
              HasSubstr("outside the 8 registered blocks"));

  // What a block transfer takes instead: the block id and the byte count, same checks.
  EXPECT_EQ(*db.BlockOf(16, 32, block_ids), 2);
  EXPECT_EQ(*db.BlockOf(32, 36, block_ids), 7);
  EXPECT_EQ(db.ChunkBytes(16, 32), full->total_bytes());
  EXPECT_EQ(db.ChunkBytes(32, 36), partial->total_bytes());
  EXPECT_THAT(db.BlockOf(48, 64, block_ids).status().message(), HasSubstr("3 block ids"));
  EXPECT_THAT(db.BlockOf(8, 24, block_ids).status().message(), HasSubstr("within one block"));
  EXPECT_THAT(db.BlockOf(0, 16, bad_ids).status().message(),
              HasSubstr("outside the 8 registered blocks"));
}

TEST(TokenDatabaseTest, PrepareValueNeedsALayout) {
  TokenDatabase db(Metadata(), 16);
  std::vector<int64_t> ids = {0};
  EXPECT_EQ(db.PrepareValue(0, 16, ids).status().code(), absl::StatusCode::kFailedPrecondition);
  absl::StatusOr<KvCacheLayout> other = KvCacheLayout::FromSegments({{0x1000, 256}}, 2, 32);
  ASSERT_TRUE(other.ok());
  EXPECT_FALSE(db.SetLayout(*other).ok());  // detected for 32-token blocks
}

TEST(TokenDatabaseTest, PlanSaveDiscardsOrKeepsPartialChunks) {
  // Whole blocks only: 40 tokens store 32; nothing new until block 3 completes.
  SavePlan plan = TokenDatabase::PlanSave(40, 0, 16, /*discard_partial_chunks=*/true);
  EXPECT_TRUE(plan.save);
  EXPECT_EQ(plan.tokens_to_save, 32u);
  plan = TokenDatabase::PlanSave(47, 32, 16, true);
  EXPECT_FALSE(plan.save);
  plan = TokenDatabase::PlanSave(48, 32, 16, true);
  EXPECT_TRUE(plan.save);
  EXPECT_EQ(plan.tokens_to_save, 48u);
  EXPECT_FALSE(TokenDatabase::PlanSave(10, 0, 16, true).save);

  // Partial chunks kept: every token, every time.
  plan = TokenDatabase::PlanSave(40, 0, 16, /*discard_partial_chunks=*/false);
  EXPECT_TRUE(plan.save);
  EXPECT_EQ(plan.tokens_to_save, 40u);
  EXPECT_TRUE(TokenDatabase::PlanSave(10, 0, 16, false).save);
}

}  // namespace
}  // namespace kvpool::engine
