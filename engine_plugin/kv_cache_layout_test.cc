#include "engine_plugin/kv_cache_layout.h"

#include <numeric>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvpool::engine {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr uint64_t kBlocks = 10;
constexpr uint32_t kBlockSize = 16;  // tokens
constexpr int64_t kHeads = 4;
constexpr int64_t kHeadDim = 8;
constexpr uint32_t kFp16 = 2;

// Row-major strides of `physical` (the order dimensions are laid out in memory), returned in
// the order of `logical_of_physical`: logical dimension i is physical dimension order[i].
std::vector<int64_t> StridesFor(const std::vector<int64_t>& physical,
                                const std::vector<size_t>& order) {
  std::vector<int64_t> physical_strides(physical.size());
  int64_t stride = 1;
  for (size_t d = physical.size(); d-- > 0;) {
    physical_strides[d] = stride;
    stride *= physical[d];
  }
  std::vector<int64_t> strides;
  for (size_t p : order) strides.push_back(physical_strides[p]);
  return strides;
}

int64_t Numel(const std::vector<int64_t>& shape) {
  return std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<>());
}

// A dense tensor laid out as `shape`, owning a storage at `base`.
TensorDesc Dense(uint64_t base, std::vector<int64_t> shape, uint32_t element_size = kFp16) {
  std::vector<size_t> order(shape.size());
  std::iota(order.begin(), order.end(), 0);
  TensorDesc t;
  t.data_ptr = base;
  t.storage_ptr = base;
  t.storage_bytes = static_cast<uint64_t>(Numel(shape)) * element_size;
  t.strides = StridesFor(shape, order);
  t.shape = std::move(shape);
  t.element_size = element_size;
  return t;
}

// A dense storage laid out as `physical`, viewed with logical dimension i = physical order[i].
TensorDesc Permuted(uint64_t base, const std::vector<int64_t>& physical,
                    const std::vector<size_t>& order, uint32_t element_size = kFp16) {
  TensorDesc t;
  t.data_ptr = base;
  t.storage_ptr = base;
  t.storage_bytes = static_cast<uint64_t>(Numel(physical)) * element_size;
  for (size_t p : order) t.shape.push_back(physical[p]);
  t.strides = StridesFor(physical, order);
  t.element_size = element_size;
  return t;
}

std::vector<uint64_t> Bases(const KvCacheLayout& layout) {
  std::vector<uint64_t> bases;
  for (const KvSegment& s : layout.segments()) bases.push_back(s.base);
  return bases;
}

std::vector<uint64_t> BlockBytes(const KvCacheLayout& layout) {
  std::vector<uint64_t> lengths;
  for (const KvSegment& s : layout.segments()) lengths.push_back(s.block_bytes);
  return lengths;
}

const uint64_t kPageKv = kBlockSize * kHeads * kHeadDim * kFp16;  // one block of K (or V)

TEST(KvCacheLayoutTest, FlashAttentionKvOuterGivesTwoSegments) {
  // (2, num_blocks, block_size, heads, head_dim): K/V outermost.
  TensorDesc t = Dense(0x10000, {2, kBlocks, kBlockSize, kHeads, kHeadDim});
  absl::StatusOr<KvCacheLayout> layout = KvCacheLayout::Detect({t}, kBlocks, kBlockSize);
  ASSERT_TRUE(layout.ok()) << layout.status();
  uint64_t seg_stride = static_cast<uint64_t>(t.strides[0]) * kFp16;
  EXPECT_EQ(seg_stride, kBlocks * kPageKv);
  EXPECT_THAT(Bases(*layout), ElementsAre(0x10000, 0x10000 + seg_stride));
  EXPECT_THAT(BlockBytes(*layout), ElementsAre(seg_stride / kBlocks, seg_stride / kBlocks));
  ASSERT_EQ(layout->regions().size(), 1u);
  EXPECT_EQ(layout->regions()[0].base, 0x10000u);
  EXPECT_EQ(layout->regions()[0].bytes, t.storage_bytes);
  EXPECT_EQ(layout->bytes_per_block(), 2 * kPageKv);
}

TEST(KvCacheLayoutTest, FlashAttentionHndStridesGiveTheSameSegments) {
  // Logical (2, N, block_size, heads, head_dim), physically (2, N, heads, block_size, head_dim).
  TensorDesc t = Permuted(0x20000, {2, kBlocks, kHeads, kBlockSize, kHeadDim}, {0, 1, 3, 2, 4});
  absl::StatusOr<KvCacheLayout> layout = KvCacheLayout::Detect({t}, kBlocks, kBlockSize);
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_THAT(Bases(*layout), ElementsAre(0x20000, 0x20000 + kBlocks * kPageKv));
  EXPECT_THAT(BlockBytes(*layout), ElementsAre(kPageKv, kPageKv));
}

TEST(KvCacheLayoutTest, FlashInferBlocksOuterGivesOneSegment) {
  // (num_blocks, 2, block_size, heads, head_dim).
  TensorDesc t = Dense(0x30000, {kBlocks, 2, kBlockSize, kHeads, kHeadDim});
  absl::StatusOr<KvCacheLayout> layout = KvCacheLayout::Detect({t}, kBlocks, kBlockSize);
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_THAT(Bases(*layout), ElementsAre(0x30000));
  EXPECT_THAT(BlockBytes(*layout), ElementsAre(t.storage_bytes / kBlocks));
  EXPECT_EQ(layout->bytes_per_block(), 2 * kPageKv);
}

TEST(KvCacheLayoutTest, MlaGivesOneSegment) {
  // (num_blocks, block_size, 576) in bf16: latent KV plus rope dims.
  TensorDesc t = Dense(0x40000, {kBlocks, kBlockSize, 576});
  absl::StatusOr<KvCacheLayout> layout = KvCacheLayout::Detect({t}, kBlocks, kBlockSize);
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_THAT(Bases(*layout), ElementsAre(0x40000));
  EXPECT_THAT(BlockBytes(*layout), ElementsAre(kBlockSize * 576 * kFp16));
}

TEST(KvCacheLayoutTest, KvPackedInLastDimensionGivesOneSegment) {
  TensorDesc t = Dense(0x50000, {kBlocks, kBlockSize, kHeads, 2 * kHeadDim});
  absl::StatusOr<KvCacheLayout> layout = KvCacheLayout::Detect({t}, kBlocks, kBlockSize);
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_THAT(BlockBytes(*layout), ElementsAre(2 * kPageKv));
}

TEST(KvCacheLayoutTest, CrossLayerTensorIsOneSegmentOfEveryLayer) {
  constexpr int64_t kLayers = 4;
  constexpr int64_t kPerLayerPage = 64;  // elements
  TensorDesc flat = Dense(0x60000, {kBlocks, kLayers * kPerLayerPage});
  absl::StatusOr<KvCacheLayout> layout = KvCacheLayout::Detect({flat}, kBlocks, kBlockSize);
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_THAT(Bases(*layout), ElementsAre(0x60000));
  EXPECT_THAT(BlockBytes(*layout), ElementsAre(kLayers * kPerLayerPage * kFp16));

  // The same memory viewed as (layers, 2, N, block_size, heads, head_dim), blocks outermost
  // in memory: (N, layers, 2, block_size, heads, head_dim).
  TensorDesc view =
      Permuted(0x70000, {kBlocks, kLayers, 2, kBlockSize, kHeads, kHeadDim}, {1, 2, 0, 3, 4, 5});
  layout = KvCacheLayout::Detect({view}, kBlocks, kBlockSize);
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_THAT(Bases(*layout), ElementsAre(0x70000));
  EXPECT_THAT(BlockBytes(*layout), ElementsAre(kLayers * 2 * kPageKv));
}

TEST(KvCacheLayoutTest, OneTensorPerLayerInLayerOrder) {
  std::vector<TensorDesc> layers;
  for (uint64_t i = 0; i < 3; ++i) {
    layers.push_back(Dense(0x100000 * (i + 1), {2, kBlocks, kBlockSize, kHeads, kHeadDim}));
  }
  absl::StatusOr<KvCacheLayout> layout = KvCacheLayout::Detect(layers, kBlocks, kBlockSize);
  ASSERT_TRUE(layout.ok()) << layout.status();
  const uint64_t v = kBlocks * kPageKv;
  EXPECT_THAT(Bases(*layout), ElementsAre(0x100000, 0x100000 + v, 0x200000, 0x200000 + v,
                                          0x300000, 0x300000 + v));
  EXPECT_EQ(layout->regions().size(), 3u);
  EXPECT_EQ(layout->bytes_per_block(), 6 * kPageKv);
}

TEST(KvCacheLayoutTest, SharedStorageIsRegisteredOnce) {
  // One allocation (layers=2, 2, N, block_size, heads, head_dim); layer i views slice i.
  constexpr uint64_t kBase = 0x800000;
  TensorDesc whole = Dense(kBase, {2, 2, kBlocks, kBlockSize, kHeads, kHeadDim});
  std::vector<TensorDesc> layers;
  for (uint64_t i = 0; i < 2; ++i) {
    TensorDesc t;
    t.data_ptr = kBase + i * 2 * kBlocks * kPageKv;
    t.storage_ptr = kBase;
    t.storage_bytes = whole.storage_bytes;
    t.shape = {2, kBlocks, kBlockSize, kHeads, kHeadDim};
    t.strides = {whole.strides[1], whole.strides[2], whole.strides[3], whole.strides[4],
                 whole.strides[5]};
    t.element_size = kFp16;
    layers.push_back(t);
  }
  absl::StatusOr<KvCacheLayout> layout = KvCacheLayout::Detect(layers, kBlocks, kBlockSize);
  ASSERT_TRUE(layout.ok()) << layout.status();
  const uint64_t v = kBlocks * kPageKv;
  EXPECT_THAT(Bases(*layout), ElementsAre(kBase, kBase + v, kBase + 2 * v, kBase + 3 * v));
  EXPECT_THAT(BlockBytes(*layout), ElementsAre(kPageKv, kPageKv, kPageKv, kPageKv));
  ASSERT_EQ(layout->regions().size(), 1u);
  EXPECT_EQ(layout->regions()[0].base, kBase);
  EXPECT_EQ(layout->regions()[0].bytes, whole.storage_bytes);

  // Layers that share one tensor outright (KV sharing) also register it once.
  TensorDesc shared = Dense(0x900000, {kBlocks, 2, kBlockSize, kHeads, kHeadDim});
  layout = KvCacheLayout::Detect({shared, shared}, kBlocks, kBlockSize);
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_EQ(layout->segments().size(), 2u);
  EXPECT_EQ(layout->regions().size(), 1u);
}

TEST(KvCacheLayoutTest, RefusesAStorageThatDoesNotDivideIntoBlocks) {
  TensorDesc t = Dense(0x1000, {kBlocks, 2, kBlockSize, kHeads, kHeadDim});
  t.storage_bytes += 6;
  absl::StatusOr<KvCacheLayout> layout = KvCacheLayout::Detect({t}, kBlocks, kBlockSize);
  EXPECT_EQ(layout.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(layout.status().message(), HasSubstr("does not divide into 10 blocks"));
}

TEST(KvCacheLayoutTest, RefusesABlockThatIsNotAMultipleOfTheBlockSize) {
  TensorDesc t = Dense(0x1000, {kBlocks, 10}, /*element_size=*/1);  // 10-byte pages
  absl::StatusOr<KvCacheLayout> layout = KvCacheLayout::Detect({t}, kBlocks, kBlockSize);
  EXPECT_EQ(layout.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(layout.status().message(), HasSubstr("not a multiple of the block size of 16"));
}

TEST(KvCacheLayoutTest, RefusesTwoOuterDimensions) {
  TensorDesc t = Dense(0x1000, {2, 3, kBlocks, kBlockSize});
  absl::StatusOr<KvCacheLayout> layout = KvCacheLayout::Detect({t}, kBlocks, kBlockSize);
  EXPECT_EQ(layout.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(layout.status().message(), HasSubstr("dimensions 0 and 1 both stride past a page"));
}

TEST(KvCacheLayoutTest, RefusesBlocksThatDoNotStepByAPage) {
  // 2N rows of 16 bytes in a storage of N 32-byte pages: no dimension steps by one block.
  TensorDesc t = Dense(0x1000, {2 * kBlocks, 16}, /*element_size=*/1);
  absl::StatusOr<KvCacheLayout> layout = KvCacheLayout::Detect({t}, kBlocks, kBlockSize);
  EXPECT_EQ(layout.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(layout.status().message(), HasSubstr("no dimension of size 10 steps by one block"));
}

TEST(KvCacheLayoutTest, RefusesASegmentThatLeavesItsStorage) {
  // Storage (N, 2 layers, 64 bytes); layer 1 is [:, 1, :]: its blocks are 128 bytes apart but
  // only 64 long, so block b of layer 1 would read into layer 0 of block b + 1 and past the end.
  TensorDesc t;
  t.storage_ptr = 0x1000;
  t.storage_bytes = kBlocks * 2 * 64;
  t.data_ptr = 0x1000 + 64;
  t.shape = {kBlocks, 64};
  t.strides = {128, 1};
  t.element_size = 1;
  t.name = "layer.1";
  absl::StatusOr<KvCacheLayout> layout = KvCacheLayout::Detect({t}, kBlocks, kBlockSize);
  EXPECT_EQ(layout.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(layout.status().message(), HasSubstr("\"layer.1\""));
  EXPECT_THAT(layout.status().message(), HasSubstr("extends past the end of its storage"));
}

TEST(KvCacheLayoutTest, RefusesMalformedDescriptions) {
  TensorDesc good = Dense(0x1000, {kBlocks, kBlockSize, 576});

  TensorDesc outside = good;
  outside.data_ptr = good.storage_ptr + good.storage_bytes;
  EXPECT_THAT(KvCacheLayout::Detect({outside}, kBlocks, kBlockSize).status().message(),
              HasSubstr("lies outside its storage"));

  TensorDesc ranks = good;
  ranks.strides.pop_back();
  EXPECT_THAT(KvCacheLayout::Detect({ranks}, kBlocks, kBlockSize).status().message(),
              HasSubstr("has 3 dimensions but strides"));

  TensorDesc resized = Dense(0x1000, {kBlocks, kBlockSize, 2 * 576});  // same storage, other size
  EXPECT_THAT(KvCacheLayout::Detect({good, resized}, kBlocks, kBlockSize).status().message(),
              HasSubstr("by an earlier tensor"));

  EXPECT_FALSE(KvCacheLayout::Detect({}, kBlocks, kBlockSize).ok());
  EXPECT_FALSE(KvCacheLayout::Detect({good}, 0, kBlockSize).ok());
  EXPECT_FALSE(KvCacheLayout::Detect({good}, kBlocks, 0).ok());
}

TEST(KvCacheLayoutTest, FromSegmentsChecksTheBlockSize) {
  EXPECT_TRUE(KvCacheLayout::FromSegments({{0x1000, 256}}, 2, 16).ok());
  EXPECT_THAT(KvCacheLayout::FromSegments({{0x1000, 250}}, 2, 16).status().message(),
              HasSubstr("not a multiple"));
}

}  // namespace
}  // namespace kvpool::engine
