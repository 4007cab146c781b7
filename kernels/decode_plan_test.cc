// The decode planner (decode_plan.h) on the CPU: every token covered exactly once, slots and
// merges consistent, long sequences split, ragged batches balanced, bad input refused with a
// reason.

#include "kernels/decode_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <random>
#include <vector>

namespace kvpool::kernels {
namespace {

constexpr int32_t kOpen = std::numeric_limits<int32_t>::max();

SplitPlanInput Input(const std::vector<int32_t>& lens, int units, int ctas) {
  SplitPlanInput in;
  in.batch = static_cast<int>(lens.size());
  in.units_per_seq = units;
  in.seq_lens = lens.data();
  in.max_seq_len = lens.empty() ? 0 : *std::max_element(lens.begin(), lens.end());
  in.ctas = ctas;
  in.granule = 16;
  in.min_chunk = 128;
  in.granule_us = 1.0;
  in.item_us = 5.0;
  in.max_slots = 2 * ctas;
  return in;
}

// Every (sequence, unit) is cut into contiguous items from 0, the last one open-ended; split
// sequences own consecutive slots named by exactly one merge item.
void ExpectCoversEveryToken(const SplitPlanInput& in, const SplitPlan& plan) {
  std::map<std::pair<int, int>, std::vector<DecodeWorkItem>> by_unit;
  for (const DecodeWorkItem& it : plan.items) by_unit[{it.seq, it.unit}].push_back(it);
  ASSERT_EQ(static_cast<int>(by_unit.size()), in.batch * in.units_per_seq);
  std::map<int, DecodeMergeItem> merges;
  for (const DecodeMergeItem& m : plan.merges) {
    EXPECT_TRUE(merges.emplace(m.seq, m).second) << "two merge items for sequence " << m.seq;
    EXPECT_GE(m.splits, 2);
  }
  std::vector<int> slot_uses(plan.slots, 0);
  for (auto& [key, items] : by_unit) {
    std::sort(items.begin(), items.end(),
              [](const DecodeWorkItem& a, const DecodeWorkItem& b) { return a.start < b.start; });
    EXPECT_EQ(items.front().start, 0);
    EXPECT_EQ(items.back().end, kOpen);
    for (size_t i = 0; i + 1 < items.size(); ++i) {
      EXPECT_EQ(items[i].end, items[i + 1].start) << "gap or overlap in sequence " << key.first;
      EXPECT_GT(items[i].end, items[i].start);
      EXPECT_EQ(items[i].start % in.granule, 0);
    }
    const auto m = merges.find(key.first);
    if (items.size() == 1) {
      EXPECT_EQ(items[0].slot, -1);
      EXPECT_EQ(m, merges.end());
    } else {
      ASSERT_NE(m, merges.end()) << "split sequence " << key.first << " has no merge item";
      ASSERT_EQ(m->second.splits, static_cast<int>(items.size()));
      for (size_t i = 0; i < items.size(); ++i) {
        EXPECT_EQ(items[i].slot, m->second.slot0 + static_cast<int>(i));
        ASSERT_GE(items[i].slot, 0);
        ASSERT_LT(items[i].slot, plan.slots);
        ++slot_uses[items[i].slot];
      }
      // The last item ends at the sequence's length: its start is below it.
      EXPECT_LT(items.back().start, in.seq_lens[key.first]);
    }
  }
  for (int s = 0; s < plan.slots; ++s) {
    EXPECT_EQ(slot_uses[s], in.units_per_seq) << "slot " << s;
  }
  EXPECT_LE(plan.slots, in.max_slots);
  if (!plan.spans) {
    EXPECT_EQ(plan.one_item, static_cast<int>(plan.items.size()) <= in.ctas);
    EXPECT_EQ(plan.grid, std::min<int>(static_cast<int>(plan.items.size()), in.ctas));
    for (const DecodeWorkItem& it : plan.items) EXPECT_EQ(it.next, -1);
    return;
  }
  // Spans: block i's chain starts at item i; the chains take every item exactly once.
  EXPECT_FALSE(plan.one_item);
  EXPECT_TRUE(plan.Chained());
  ASSERT_GE(plan.grid, 1);
  ASSERT_LE(plan.grid, in.ctas);
  std::vector<int> taken(plan.items.size(), 0);
  for (int b = 0; b < plan.grid; ++b) {
    for (int32_t i = b; i >= 0; i = plan.items[i].next) {
      ASSERT_LT(i, static_cast<int32_t>(plan.items.size()));
      ASSERT_EQ(taken[i]++, 0) << "item " << i << " taken twice";
    }
  }
  for (size_t i = 0; i < taken.size(); ++i) EXPECT_EQ(taken[i], 1) << "item " << i;
}

// Each block's work in a span plan: the granules of its chain's items plus their fixed costs.
std::vector<double> ChainLoads(const SplitPlanInput& in, const SplitPlan& plan,
                               const std::vector<int32_t>& lens) {
  std::vector<double> loads;
  for (int b = 0; b < plan.grid; ++b) {
    double load = 0;
    for (int32_t i = b; i >= 0; i = plan.items[i].next) {
      const DecodeWorkItem& it = plan.items[i];
      const int64_t end = it.end == kOpen ? lens[it.seq] : it.end;
      load += (end - it.start + in.granule - 1) / in.granule * in.granule_us + in.item_us;
    }
    loads.push_back(load);
  }
  return loads;
}

// 64 lengths of 1k-16k (as SeededLengths(64, 1024, 16384, 1) would give, fixed here so that the
// planner test needs no reference library).
std::vector<int32_t> SeededLengthsForTest() {
  std::mt19937 rng(1);
  std::uniform_int_distribution<int> len(1024, 16384);
  std::vector<int32_t> lens(64);
  for (int32_t& l : lens) l = len(rng);
  lens[0] = 16384;
  return lens;
}

int64_t ItemTokens(const DecodeWorkItem& it, const std::vector<int32_t>& lens) {
  return (it.end == kOpen ? lens[it.seq] : it.end) - it.start;
}

TEST(DecodePlanTest, OneLongSequenceIsSplitAcrossTheGpu) {
  const std::vector<int32_t> lens = {131072};
  const SplitPlanInput in = Input(lens, 2, 132);
  SplitPlan plan;
  ASSERT_TRUE(PlanSplits(in, &plan).ok());
  ExpectCoversEveryToken(in, plan);
  EXPECT_GE(plan.items.size(), 100u) << DescribePlan(plan);
  EXPECT_LE(plan.items.size(), 132u) << DescribePlan(plan);
  EXPECT_TRUE(plan.one_item);
  ASSERT_EQ(plan.merges.size(), 1u);
}

TEST(DecodePlanTest, RaggedBatchIsBalanced) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> len(512, 8192);
  std::vector<int32_t> lens(128);
  for (int32_t& l : lens) l = len(rng);
  const SplitPlanInput in = Input(lens, 1, 924);
  SplitPlan plan;
  ASSERT_TRUE(PlanSplits(in, &plan).ok());
  ExpectCoversEveryToken(in, plan);
  // The modelled finish time is within 25% of the ideal (all work spread evenly) plus the merge.
  double work = 0;
  for (int32_t l : lens) work += (l + 15) / 16 * in.granule_us;
  const double ideal = work / in.ctas + in.item_us;
  EXPECT_LE(plan.modelled_us, 1.25 * ideal + in.merge_us + in.counter_us) << DescribePlan(plan);
  // Longest first.
  for (size_t i = 0; i + 1 < plan.items.size(); ++i) {
    EXPECT_GE(ItemTokens(plan.items[i], lens) + 15, ItemTokens(plan.items[i + 1], lens));
  }
}

TEST(DecodePlanTest, RandomBatchesCoverEveryToken) {
  std::mt19937 rng(11);
  for (int round = 0; round < 50; ++round) {
    std::vector<int32_t> lens(1 + rng() % 40);
    for (int32_t& l : lens) l = rng() % 3 == 0 ? static_cast<int32_t>(rng() % 20000) : rng() % 300;
    SplitPlanInput in = Input(lens, 1 + rng() % 4, 16 + rng() % 300);
    in.max_seq_len += static_cast<int>(rng() % 100);
    if (round % 5 == 0) in.max_slots = static_cast<int>(rng() % 8);
    in.spans = round % 2 == 1;
    SplitPlan plan;
    ASSERT_TRUE(PlanSplits(in, &plan).ok());
    ExpectCoversEveryToken(in, plan);
    EXPECT_LE(static_cast<int64_t>(plan.items.size()), MaxPlanItems(in));
    EXPECT_LE(plan.slots, MaxPlanSlots(in));
  }
}

TEST(DecodePlanTest, OneWaveKeepsItemsWithinTheBlocks) {
  const std::vector<int32_t> lens = SeededLengthsForTest();
  SplitPlanInput in = Input(lens, 1, 132);
  in.granule = 64;
  in.min_chunk = 256;
  SplitPlan free_plan, one_wave;
  ASSERT_TRUE(PlanSplits(in, &free_plan).ok());
  in.one_wave = true;
  ASSERT_TRUE(PlanSplits(in, &one_wave).ok());
  ExpectCoversEveryToken(in, one_wave);
  EXPECT_GT(free_plan.items.size(), 132u) << DescribePlan(free_plan);
  EXPECT_LE(one_wave.items.size(), 132u) << DescribePlan(one_wave);
}

// MLA's ragged row (64 x 1k-16k, 64-token granules, 132 blocks): spans give every block about
// the same work, where the per-sequence plan's longest item is twice a block's share.
TEST(DecodePlanTest, SpansEvenOutARaggedBatch) {
  const std::vector<int32_t> lens = SeededLengthsForTest();
  SplitPlanInput in = Input(lens, 1, 132);
  in.granule = 64;
  in.min_chunk = 256;
  in.granule_us = 2.16;
  in.one_wave = true;
  SplitPlan per_seq, spans;
  ASSERT_TRUE(PlanSplits(in, &per_seq).ok());
  in.spans = true;
  ASSERT_TRUE(PlanSplits(in, &spans).ok());
  ExpectCoversEveryToken(in, spans);
  EXPECT_FALSE(per_seq.spans);
  ASSERT_TRUE(spans.spans) << DescribePlan(spans);
  EXPECT_LT(spans.modelled_us, 0.7 * per_seq.modelled_us);
  double work = 0;
  for (int32_t l : lens) work += (l + 63) / 64 * in.granule_us;
  const std::vector<double> loads = ChainLoads(in, spans, lens);
  EXPECT_EQ(static_cast<int>(loads.size()), in.ctas);
  // Every block within a min_chunk and three items' fixed cost of an even share.
  for (double load : loads) {
    EXPECT_LE(load, work / in.ctas + 4 * in.granule_us + 3 * in.item_us);
    EXPECT_GE(load, work / in.ctas - 4 * in.granule_us - 3 * in.item_us);
  }
  // Pieces of a cut sequence keep min_chunk tokens (the last one: its granules).
  for (const DecodeWorkItem& it : spans.items) {
    if (it.slot < 0) continue;
    EXPECT_GE((ItemTokens(it, lens) + 63) / 64 * 64, in.min_chunk) << it.seq << " " << it.start;
  }
}

// Where the per-sequence plan is already even (every sequence alike), it stays.
TEST(DecodePlanTest, SpansLeaveEvenBatchesAlone) {
  for (const std::vector<int32_t>& lens :
       {std::vector<int32_t>(128, 8192), std::vector<int32_t>{65536}}) {
    SplitPlanInput in = Input(lens, 1, 132);
    in.granule = 64;
    in.min_chunk = 256;
    in.granule_us = 2.16;
    in.one_wave = true;
    in.spans = true;
    SplitPlan plan;
    ASSERT_TRUE(PlanSplits(in, &plan).ok());
    ExpectCoversEveryToken(in, plan);
    EXPECT_FALSE(plan.spans) << DescribePlan(plan);
    EXPECT_TRUE(plan.one_item) << DescribePlan(plan);
  }
}

TEST(DecodePlanTest, UniformPlanAssumesFullLengths) {
  const std::vector<int32_t> lens = {100, 5000, 0};
  SplitPlanInput in = Input(lens, 1, 64);
  in.uniform = true;
  SplitPlan plan;
  ASSERT_TRUE(PlanSplits(in, &plan).ok());
  // Every sequence is planned as 5000 tokens: all three split alike.
  ASSERT_EQ(plan.merges.size(), 3u);
  EXPECT_EQ(plan.merges[0].splits, plan.merges[2].splits);
}

TEST(DecodePlanTest, ForcedChunk) {
  const std::vector<int32_t> lens = {4096, 1000};
  SplitPlanInput in = Input(lens, 1, 132);
  in.forced_chunk = 512;
  SplitPlan plan;
  ASSERT_TRUE(PlanSplits(in, &plan).ok());
  ExpectCoversEveryToken(in, plan);
  EXPECT_EQ(plan.chunk, 512);
  EXPECT_EQ(plan.items.size(), 8u + 2u);
}

TEST(DecodePlanTest, NoSlotsMeansNoSplits) {
  const std::vector<int32_t> lens = {65536, 10};
  SplitPlanInput in = Input(lens, 1, 132);
  in.max_slots = 0;
  SplitPlan plan;
  ASSERT_TRUE(PlanSplits(in, &plan).ok());
  EXPECT_TRUE(plan.merges.empty());
  EXPECT_EQ(plan.items.size(), 2u);
}

TEST(DecodePlanTest, RefusalsSayWhy) {
  std::vector<int32_t> lens = {10, 20, 30, 40};
  SplitPlanInput in = Input(lens, 1, 132);
  in.max_seq_len = 35;
  SplitPlan plan;
  KernelStatus st = PlanSplits(in, &plan);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.reason.find("seq_lens[3] = 40"), std::string::npos) << st.reason;
  in.max_seq_len = 40;
  in.forced_chunk = 100;
  st = PlanSplits(in, &plan);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.reason.find("multiple of 16"), std::string::npos) << st.reason;
  in.forced_chunk = 0;
  in.ctas = 0;
  st = PlanSplits(in, &plan);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.reason.find("ctas 0"), std::string::npos) << st.reason;
}

TEST(DecodePlanTest, WorkspaceLayoutIsAlignedAndOrdered) {
  const DecodeWorkspaceLayout l = LayoutDecodeWorkspace(1000, 7, 33, 32, 128);
  EXPECT_EQ(l.items, 256u);
  EXPECT_GE(l.merges, l.items + 1000 * sizeof(DecodeWorkItem));
  EXPECT_GE(l.part_lse, l.merges + 7 * sizeof(DecodeMergeItem));
  EXPECT_GE(l.part_o, l.part_lse + 4u * 33 * 32);
  EXPECT_GE(l.total, l.part_o + 4u * 33 * 32 * 128);
  for (size_t off : {l.items, l.merges, l.part_lse, l.part_o, l.total}) EXPECT_EQ(off % 256, 0u);
}

TEST(DecodePlanTest, SmallWorkspaceTakesFewerSplitsOrIsRefused) {
  const std::vector<int32_t> lens = {131072};
  SplitPlanInput in = Input(lens, 8, 132);
  const size_t full = DecodeWorkspaceBytes(in, 32, 128);
  SplitPlan plan;
  DecodeWorkspaceLayout layout;
  SplitPlanInput roomy = in;
  ASSERT_TRUE(PlanSplitsInWorkspace("Test", &roomy, 32, 128, full, &plan, &layout).ok());
  EXPECT_EQ(roomy.max_slots, in.max_slots);
  EXPECT_LE(layout.total, full);
  const int roomy_slots = plan.slots;
  ExpectCoversEveryToken(roomy, plan);

  // Room for half the partial results the roomy plan wrote: at most that many, every token still
  // covered, within the bytes.
  ASSERT_GE(roomy_slots, 2);
  SplitPlanInput half = in;
  half.max_slots = roomy_slots / 2;
  const size_t tight_bytes = DecodeWorkspaceBytes(half, 32, 128);
  SplitPlanInput tight = in;
  ASSERT_TRUE(PlanSplitsInWorkspace("Test", &tight, 32, 128, tight_bytes, &plan, &layout).ok());
  EXPECT_GE(tight.max_slots, roomy_slots / 2);
  EXPECT_LT(tight.max_slots, in.max_slots);
  EXPECT_LE(plan.slots, roomy_slots / 2);
  EXPECT_LE(layout.total, tight_bytes);
  ExpectCoversEveryToken(tight, plan);

  // Not even the unsplit plan fits: refused, naming the caller and the sizes.
  SplitPlanInput none = in;
  const KernelStatus st = PlanSplitsInWorkspace("Test", &none, 32, 128, 100, &plan, &layout);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.reason.find("Test: a workspace of 100 bytes"), std::string::npos) << st.reason;
}

}  // namespace
}  // namespace kvpool::kernels
