#include "engine_plugin/store_worker.h"

#include <cstring>
#include <numeric>

#include "engine_plugin/notified_ready_event.h"
#include "engine_plugin/testing/fake_store.h"
#include "engine_plugin/testing/requests.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/error_codes.h"

namespace kvpool::engine {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAre;
using testing::FakeStore;

constexpr uint32_t kBlockSize = 4;
constexpr uint64_t kBlocks = 6;
constexpr int64_t kHeads = 2;
constexpr int64_t kHeadDim = 4;

// One FlashAttention-style layer (2, blocks, block_size, heads, head_dim) of floats.
struct Layer {
  Layer() : data(2 * kBlocks * kBlockSize * kHeads * kHeadDim) {
    std::iota(data.begin(), data.end(), 1.0f);
  }
  TensorDesc Desc() const {
    TensorDesc t;
    t.data_ptr = reinterpret_cast<uint64_t>(data.data());
    t.storage_ptr = t.data_ptr;
    t.storage_bytes = data.size() * sizeof(float);
    t.shape = {2, kBlocks, kBlockSize, kHeads, kHeadDim};
    t.strides = {kBlocks * kBlockSize * kHeads * kHeadDim, kBlockSize * kHeads * kHeadDim,
                 kHeads * kHeadDim, kHeadDim, 1};
    t.element_size = sizeof(float);
    return t;
  }
  std::vector<float> data;
};

StoreWorkerOptions Options() {
  return StoreWorkerOptions{.model_name = "org/tiny-model/", .num_kv_heads = kHeads,
                            .block_size = kBlockSize};
}

ReqMeta SaveRequest(const std::string& id, std::vector<std::string> hashes,
                    std::vector<int64_t> block_ids) {
  return testing::SaveRequest(id, std::move(hashes), std::move(block_ids), kBlockSize);
}

TEST(StoreWorkerTest, KeysAndStepsFollowTheParallelism) {
  FakeStore store;
  StoreWorkerOptions o = Options();
  o.tp_size = 4;
  o.tp_rank = 3;
  o.num_kv_heads = 2;  // two ranks per head group: they share keys and split the stores
  o.pp_size = 2;
  o.pp_rank = 1;
  absl::StatusOr<std::unique_ptr<StoreWorker>> worker = StoreWorker::Create(store, o);
  ASSERT_TRUE(worker.ok()) << worker.status();
  EXPECT_EQ((*worker)->put_step(), 2);
  EXPECT_EQ((*worker)->token_database().KeyFor("ab"), "tiny-model@tp_rank:1@pcp0@dcp0@pp_rank:1@ab");

  o = Options();
  o.pcp_size = 2;
  o.pcp_rank = 1;
  o.dcp_size = 2;
  o.dcp_rank = 1;
  worker = StoreWorker::Create(store, o);
  ASSERT_TRUE(worker.ok());
  EXPECT_EQ((*worker)->block_size(), kBlockSize * 4);
  EXPECT_EQ((*worker)->token_database().KeyFor("ab"), "tiny-model@tp_rank:0@pcp1@dcp1@pp_rank:0@ab");

  o = Options();
  o.use_mla = true;
  o.tp_size = 4;
  o.tp_rank = 2;
  worker = StoreWorker::Create(store, o);
  ASSERT_TRUE(worker.ok());
  EXPECT_EQ((*worker)->put_step(), 4);
  EXPECT_EQ((*worker)->key_metadata().tp_rank, 0);
}

TEST(StoreWorkerTest, RefusesBadOptions) {
  FakeStore store;
  StoreWorkerOptions o = Options();
  o.tp_rank = 2;
  EXPECT_THAT(StoreWorker::Create(store, o).status().message(), HasSubstr("tp_rank 2"));
  o = Options();
  o.model_name = "/";
  EXPECT_FALSE(StoreWorker::Create(store, o).ok());
  o = Options();
  o.block_size = 0;
  EXPECT_FALSE(StoreWorker::Create(store, o).ok());
  EXPECT_TRUE(ParseKvRole("kv_both").ok());
  EXPECT_FALSE(ParseKvRole("both").ok());
}

TEST(StoreWorkerTest, RegistersEachStorageOnceAndOnlyOnce) {
  FakeStore store;
  Layer l0, l1;
  std::unique_ptr<StoreWorker> worker = *StoreWorker::Create(store, Options());
  EXPECT_EQ(worker->GetFinished({}, {}).status().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(worker->RegisterKvCaches({l0.Desc(), l1.Desc(), l0.Desc()}, kBlocks).ok());
  EXPECT_EQ(store.registered().size(), 2u);
  EXPECT_EQ(worker->layout()->segments().size(), 6u);
  EXPECT_EQ(worker->RegisterKvCaches({l0.Desc()}, kBlocks).code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(StoreWorkerTest, StoresThenLoadsIdenticalBytes) {
  FakeStore store;
  Layer l0, l1;
  std::unique_ptr<StoreWorker> worker = *StoreWorker::Create(store, Options());
  ASSERT_TRUE(worker->RegisterKvCaches({l0.Desc(), l1.Desc()}, kBlocks).ok());
  std::vector<float> original0 = l0.data, original1 = l1.data;

  StepMetadata step;
  step.requests.push_back(SaveRequest("r1", {"h0", "h1", "h2"}, {4, 1, 3}));
  step.store_ready = std::make_shared<NotifiedReadyEvent>(/*ready=*/true);
  ASSERT_TRUE(worker->GetFinished({}, std::move(step)).ok());
  worker->WaitIdle();
  EXPECT_EQ(worker->sender()->stats().keys_stored, 3u);

  std::fill(l0.data.begin(), l0.data.end(), 0.0f);
  std::fill(l1.data.begin(), l1.data.end(), 0.0f);
  ReqMeta load;
  load.req_id = "r2";
  load.token_len_chunk = 3 * kBlockSize;
  load.block_hashes = {"h0", "h1", "h2"};
  load.block_ids = {4, 1, 3};
  load.load_spec = LoadSpec{.vllm_cached_tokens = 0, .kvpool_cached_tokens = 3 * kBlockSize,
                            .can_load = true};
  StepMetadata load_step;
  load_step.requests.push_back(load);
  absl::StatusOr<StoreWorker::Finished> issued = worker->GetFinished({}, std::move(load_step));
  ASSERT_TRUE(issued.ok());
  worker->WaitIdle();
  absl::StatusOr<StoreWorker::Finished> finished = worker->GetFinished({}, {});
  // Reported once, by whichever step saw the load complete.
  finished->recving.insert(issued->recving.begin(), issued->recving.end());
  EXPECT_THAT(finished->recving, UnorderedElementsAre("r2"));

  // Blocks 4, 1, 3 of both K and V of both layers are back; the others stay zero.
  const size_t block_floats = kBlockSize * kHeads * kHeadDim;
  for (size_t kv = 0; kv < 2; ++kv) {
    for (size_t b = 0; b < kBlocks; ++b) {
      size_t offset = (kv * kBlocks + b) * block_floats;
      bool loaded = b == 4 || b == 1 || b == 3;
      for (size_t i = 0; i < block_floats; ++i) {
        ASSERT_EQ(l0.data[offset + i], loaded ? original0[offset + i] : 0.0f);
        ASSERT_EQ(l1.data[offset + i], loaded ? original1[offset + i] : 0.0f);
      }
    }
  }
}

TEST(StoreWorkerTest, LoadLengthFollowsThePoolHit) {
  FakeStore store;
  Layer l0;
  std::unique_ptr<StoreWorker> worker = *StoreWorker::Create(store, Options());
  ASSERT_TRUE(worker->RegisterKvCaches({l0.Desc()}, kBlocks).ok());
  auto load = [&](uint64_t pool_hit, uint64_t token_len_chunk) {
    ReqMeta r;
    r.req_id = "r";
    r.token_len_chunk = token_len_chunk;
    r.block_hashes = {"h0", "h1", "h2"};
    r.block_ids = {0, 1, 2};
    r.load_spec = LoadSpec{.kvpool_cached_tokens = pool_hit, .can_load = true};
    StepMetadata step;
    step.requests.push_back(r);
    EXPECT_TRUE(worker->GetFinished({}, std::move(step)).ok());
    worker->WaitIdle();
    return store.get_keys().back().size();
  };
  EXPECT_EQ(load(8, 12), 2u);   // whole blocks: two chunks
  EXPECT_EQ(load(11, 12), 3u);  // one short of a partial block: its last token comes too
  EXPECT_EQ(load(10, 12), 3u);  // a partial block is loaded up to the hit
}

TEST(StoreWorkerTest, FinishedSendingWaitsForPendingStoresAndDropsPreempted) {
  FakeStore store;
  Layer l0;
  std::unique_ptr<StoreWorker> worker = *StoreWorker::Create(store, Options());
  ASSERT_TRUE(worker->RegisterKvCaches({l0.Desc()}, kBlocks).ok());

  // r1 stores and its store completes before it finishes.
  StepMetadata step1;
  step1.requests.push_back(SaveRequest("r1", {"a0"}, {0}));
  ASSERT_TRUE(worker->GetFinished({}, std::move(step1)).ok());
  worker->WaitIdle();
  absl::StatusOr<StoreWorker::Finished> f = worker->GetFinished({"r1"}, {});
  EXPECT_THAT(f->sending, UnorderedElementsAre("r1"));

  // r2 finishes while its store waits for the ready event: reported a step later.
  auto ready = std::make_shared<NotifiedReadyEvent>();
  StepMetadata step2;
  step2.requests.push_back(SaveRequest("r2", {"b0"}, {1}));
  step2.store_ready = ready;
  f = worker->GetFinished({"r2"}, std::move(step2));
  EXPECT_THAT(f->sending, IsEmpty());
  ready->Notify();
  worker->WaitIdle();
  f = worker->GetFinished({}, {});
  EXPECT_THAT(f->sending, UnorderedElementsAre("r2"));
  EXPECT_FALSE(worker->sender()->PendingJobs("r2").has_value());

  // r3 is preempted: its bookkeeping goes, it is never reported.
  auto blocked = std::make_shared<NotifiedReadyEvent>();
  StepMetadata step3;
  step3.requests.push_back(SaveRequest("r3", {"c0"}, {2}));
  step3.store_ready = blocked;
  ASSERT_TRUE(worker->GetFinished({}, std::move(step3)).ok());
  StepMetadata step4;
  step4.preempted_req_ids.insert("r3");
  f = worker->GetFinished({}, std::move(step4));
  EXPECT_FALSE(worker->sender()->PendingJobs("r3").has_value());
  blocked->Notify();
  worker->WaitIdle();
  f = worker->GetFinished({"r3"}, {});
  EXPECT_THAT(f->sending, IsEmpty());

  // A request that never stored is not reported.
  f = worker->GetFinished({"never"}, {});
  EXPECT_THAT(f->sending, IsEmpty());
}

TEST(StoreWorkerTest, ConsumersDoNotStore) {
  FakeStore store;
  Layer l0;
  StoreWorkerOptions o = Options();
  o.kv_role = KvRole::kConsumer;
  std::unique_ptr<StoreWorker> worker = *StoreWorker::Create(store, o);
  ASSERT_TRUE(worker->RegisterKvCaches({l0.Desc()}, kBlocks).ok());
  EXPECT_EQ(worker->sender(), nullptr);
  StepMetadata step;
  step.requests.push_back(SaveRequest("r1", {"a0"}, {0}));
  ASSERT_TRUE(worker->GetFinished({"r1"}, std::move(step)).ok());
  worker->WaitIdle();
  EXPECT_EQ(store.put_calls(), 0);
}

TEST(StoreWorkerTest, LookupChecksEveryTpAndPpRank) {
  FakeStore store;
  StoreWorkerOptions o = Options();
  o.tp_size = 4;
  o.num_kv_heads = 2;  // TP ranks 0-1 and 2-3 share keys: key tp ranks 0 and 1
  o.pp_size = 2;
  std::unique_ptr<StoreWorker> worker = *StoreWorker::Create(store, o);
  std::vector<std::string> hashes = {"h0", "h1", "h2"};
  auto key = [](int tp, int pp, const std::string& hash) {
    return PoolKey({.model_name = "tiny-model", .tp_rank = tp, .pp_rank = pp}, hash);
  };

  EXPECT_EQ(worker->Lookup(12, hashes), 0u);
  for (int tp = 0; tp < 2; ++tp) {
    for (int pp = 0; pp < 2; ++pp) {
      for (const std::string& h : hashes) {
        if (tp == 1 && pp == 1 && h == "h2") continue;  // one rank lacks the last chunk
        store.Set(key(tp, pp, h), "v");
      }
    }
  }
  EXPECT_EQ(worker->Lookup(12, hashes), 8u);
  store.Set(key(1, 1, "h2"), "v");
  EXPECT_EQ(worker->Lookup(12, hashes), 12u);
  EXPECT_EQ(worker->Lookup(10, hashes), 10u);  // the end of the last (partial) chunk
  EXPECT_EQ(worker->Lookup(12, {}), 0u);
  ASSERT_EQ(store.exist_keys().back().size(), 12u);  // 3 chunks x 2 tp x 2 pp

  // Keys of TP ranks beyond the head count are not asked for.
  for (const std::vector<std::string>& keys : store.exist_keys()) {
    for (const std::string& k : keys) EXPECT_THAT(k, ::testing::Not(HasSubstr("tp_rank:2")));
  }

  // A pool that cannot answer has nothing.
  store.FailExist(absl::UnavailableError("master down"));
  EXPECT_EQ(worker->Lookup(12, hashes), 0u);
}

// A BlockTransfer over host memory standing in for GpuBlockMover: whole blocks (every segment
// in layout order) kept in the FakeStore under their keys; records the block ids it was given
// and can be told to answer every store with one status.
class HostBlockTransfer : public BlockTransfer {
 public:
  HostBlockTransfer(FakeStore& store, const KvCacheLayout& layout)
      : store_(store), layout_(layout) {}
  std::vector<absl::Status> StoreBlocks(absl::Span<const std::string> keys,
                                        absl::Span<const int32_t> block_ids) override {
    stored_ids.insert(stored_ids.end(), block_ids.begin(), block_ids.end());
    std::vector<absl::Status> out;
    for (size_t i = 0; i < keys.size(); ++i) {
      if (!store_status.ok()) {
        out.push_back(store_status);
        continue;
      }
      std::string value;
      for (const KvSegment& s : layout_.segments()) {
        value.append(reinterpret_cast<const char*>(s.base + block_ids[i] * s.block_bytes),
                     s.block_bytes);
      }
      store_.Set(keys[i], std::move(value));
      out.push_back(absl::OkStatus());
    }
    return out;
  }
  std::vector<absl::Status> LoadBlocks(absl::Span<const std::string> keys,
                                       absl::Span<const int32_t> block_ids) override {
    loaded_ids.insert(loaded_ids.end(), block_ids.begin(), block_ids.end());
    std::vector<absl::Status> out;
    for (size_t i = 0; i < keys.size(); ++i) {
      std::optional<std::string> value = store_.Value(keys[i]);
      if (!value.has_value()) {
        out.push_back(absl::NotFoundError(keys[i]));
        continue;
      }
      size_t offset = 0;
      for (const KvSegment& s : layout_.segments()) {
        std::memcpy(reinterpret_cast<void*>(s.base + block_ids[i] * s.block_bytes),
                    value->data() + offset, s.block_bytes);
        offset += s.block_bytes;
      }
      out.push_back(absl::OkStatus());
    }
    return out;
  }
  // With `locates`, answers lookups itself (as GpuBlockMover does, keeping locations).
  std::optional<std::vector<bool>> Locate(absl::Span<const std::string> keys) override {
    if (!locates) return std::nullopt;
    located_keys.emplace_back(keys.begin(), keys.end());
    std::vector<bool> present;
    for (const std::string& key : keys) present.push_back(store_.Value(key).has_value());
    return present;
  }
  std::vector<int32_t> stored_ids, loaded_ids;
  absl::Status store_status;
  bool locates = false;
  std::vector<std::vector<std::string>> located_keys;

 private:
  FakeStore& store_;
  KvCacheLayout layout_;
};

// The scheduler's lookup asks the transfer about this rank's own keys (it keeps their
// locations for the load) and the store about the other ranks' keys, each key once.
TEST(StoreWorkerTest, LookupLocatesThisRanksKeysThroughTheTransfer) {
  FakeStore store;
  Layer l0;
  StoreWorkerOptions o = Options();
  o.tp_size = 2;
  o.num_kv_heads = 2;
  o.tp_rank = 1;
  std::unique_ptr<StoreWorker> worker = *StoreWorker::Create(store, o);
  HostBlockTransfer* transfer = nullptr;
  ASSERT_TRUE(worker
                  ->RegisterDeviceKvCaches(
                      {l0.Desc()}, kBlocks,
                      [&](const KvCacheLayout& layout)
                          -> absl::StatusOr<std::unique_ptr<BlockTransfer>> {
                        auto t = std::make_unique<HostBlockTransfer>(store, layout);
                        t->locates = true;
                        transfer = t.get();
                        return std::unique_ptr<BlockTransfer>(std::move(t));
                      })
                  .ok());
  std::vector<std::string> hashes = {"h0", "h1", "h2"};
  auto key = [](int tp, const std::string& hash) {
    return PoolKey({.model_name = "tiny-model", .tp_rank = tp}, hash);
  };
  for (const std::string& h : hashes) store.Set(key(0, h), "v");
  store.Set(key(1, "h0"), "v");
  store.Set(key(1, "h1"), "v");
  EXPECT_EQ(worker->Lookup(12, hashes), 8u);  // rank 1 lacks h2
  ASSERT_EQ(transfer->located_keys.size(), 1u);
  EXPECT_EQ(transfer->located_keys[0],
            (std::vector<std::string>{key(1, "h0"), key(1, "h1"), key(1, "h2")}));
  EXPECT_EQ(store.exist_keys().back(),
            (std::vector<std::string>{key(0, "h0"), key(0, "h1"), key(0, "h2")}));
  store.Set(key(1, "h2"), "v");
  EXPECT_EQ(worker->Lookup(12, hashes), 12u);
  std::vector<std::string> other = {"h0", "g1", "h2"};
  store.Set(key(1, "g1"), "v");
  EXPECT_EQ(worker->Lookup(12, other), 4u);  // rank 0 lacks g1

  // A transfer without a lookup path of its own: the store is asked about every key.
  transfer->locates = false;
  EXPECT_EQ(worker->Lookup(12, other), 4u);
  EXPECT_EQ(store.exist_keys().back().size(), 6u);
  EXPECT_EQ(transfer->located_keys.size(), 3u);
}

TEST(StoreWorkerTest, DeviceCachesMoveWholeBlocksThroughTheTransfer) {
  FakeStore store;
  Layer l0, l1;
  std::unique_ptr<StoreWorker> worker = *StoreWorker::Create(store, Options());
  HostBlockTransfer* transfer = nullptr;
  absl::Status registered = worker->RegisterDeviceKvCaches(
      {l0.Desc(), l1.Desc()}, kBlocks,
      [&](const KvCacheLayout& layout) -> absl::StatusOr<std::unique_ptr<BlockTransfer>> {
        auto t = std::make_unique<HostBlockTransfer>(store, layout);
        transfer = t.get();
        return std::unique_ptr<BlockTransfer>(std::move(t));
      });
  ASSERT_TRUE(registered.ok()) << registered;
  EXPECT_TRUE(worker->has_transfer());
  EXPECT_THAT(store.registered(), IsEmpty());  // device memory is never the store's buffer
  std::vector<float> original0 = l0.data, original1 = l1.data;

  StepMetadata step;
  step.requests.push_back(SaveRequest("r1", {"h0", "h1", "h2"}, {4, 1, 3}));
  step.store_ready = std::make_shared<NotifiedReadyEvent>(/*ready=*/true);
  ASSERT_TRUE(worker->GetFinished({}, std::move(step)).ok());
  worker->WaitIdle();
  EXPECT_EQ(transfer->stored_ids, (std::vector<int32_t>{4, 1, 3}));
  EXPECT_EQ(store.put_calls(), 0);   // no gather-put of host buffers
  EXPECT_EQ(store.exist_calls(), 1);  // the existence check still comes first
  EXPECT_EQ(worker->sender()->stats().keys_stored, 3u);
  // The object is the block's bytes in every segment, in layout order (what a host cache's
  // chunk put stores too).
  std::string expected;
  for (const KvSegment& s : worker->layout()->segments()) {
    expected.append(reinterpret_cast<const char*>(s.base + 1 * s.block_bytes), s.block_bytes);
  }
  EXPECT_EQ(store.Value(worker->token_database().KeyFor("h1")), expected);
  EXPECT_EQ(worker->sender()->stats().bytes_stored, 3 * expected.size());

  // Load into other blocks; h3 was never stored: its block is reported for recompute.
  std::fill(l0.data.begin(), l0.data.end(), 0.0f);
  std::fill(l1.data.begin(), l1.data.end(), 0.0f);
  ReqMeta load;
  load.req_id = "r2";
  load.token_len_chunk = 4 * kBlockSize;
  load.block_hashes = {"h0", "h1", "h2", "h3"};
  load.block_ids = {0, 2, 5, 1};
  load.load_spec = LoadSpec{.vllm_cached_tokens = 0, .kvpool_cached_tokens = 4 * kBlockSize,
                            .can_load = true};
  StepMetadata load_step;
  load_step.requests.push_back(load);
  ASSERT_TRUE(worker->GetFinished({}, std::move(load_step)).ok());
  worker->WaitIdle();
  EXPECT_THAT(transfer->loaded_ids, UnorderedElementsAre(0, 2, 5, 1));
  EXPECT_EQ(store.get_calls(), 0);
  EXPECT_THAT(worker->TakeFailedLoadBlockIds(), UnorderedElementsAre(1));
  EXPECT_EQ(worker->receiver()->stats().keys_loaded, 3u);
  const size_t block = kBlockSize * kHeads * kHeadDim;  // floats per block per K/V
  for (auto [from, to] : {std::pair{4, 0}, std::pair{1, 2}, std::pair{3, 5}}) {
    for (size_t kv = 0; kv < 2; ++kv) {
      for (size_t i = 0; i < block; ++i) {
        ASSERT_EQ(l0.data[(kv * kBlocks + to) * block + i],
                  original0[(kv * kBlocks + from) * block + i]);
        ASSERT_EQ(l1.data[(kv * kBlocks + to) * block + i],
                  original1[(kv * kBlocks + from) * block + i]);
      }
    }
  }

  // Pressure from the transfer backs off like pressure from the store.
  transfer->store_status = ErrorStatus(v1::NO_AVAILABLE_HANDLE, "full");
  StepMetadata full;
  full.requests.push_back(SaveRequest("r3", {"h4"}, {0}));
  ASSERT_TRUE(worker->GetFinished({}, std::move(full)).ok());
  worker->WaitIdle();
  EXPECT_TRUE(worker->sender()->store_pressure_active());
}

// start_load_kv / wait_for_layer_load: the loads of the step start at once, on the caller's
// thread (a transfer without layers of its own loads everything then); the next GetFinished
// reports them (finished, failed blocks) and does not load them a second time.
TEST(StoreWorkerTest, LayerwiseLoadsStartNowAndAreReportedOnce) {
  FakeStore store;
  Layer l0, l1;
  std::unique_ptr<StoreWorker> worker = *StoreWorker::Create(store, Options());
  HostBlockTransfer* transfer = nullptr;
  ASSERT_TRUE(worker
                  ->RegisterDeviceKvCaches(
                      {l0.Desc(), l1.Desc()}, kBlocks,
                      [&](const KvCacheLayout& layout)
                          -> absl::StatusOr<std::unique_ptr<BlockTransfer>> {
                        auto t = std::make_unique<HostBlockTransfer>(store, layout);
                        transfer = t.get();
                        return std::unique_ptr<BlockTransfer>(std::move(t));
                      })
                  .ok());
  std::vector<float> original0 = l0.data;
  StepMetadata save;
  save.requests.push_back(SaveRequest("s", {"h0", "h1"}, {4, 1}));
  save.store_ready = std::make_shared<NotifiedReadyEvent>(/*ready=*/true);
  ASSERT_TRUE(worker->GetFinished({}, std::move(save)).ok());
  worker->WaitIdle();
  std::fill(l0.data.begin(), l0.data.end(), 0.0f);

  auto load_request = [](const std::string& id, std::vector<std::string> hashes,
                         std::vector<int64_t> ids) {
    ReqMeta load;
    load.req_id = id;
    load.token_len_chunk = hashes.size() * kBlockSize;
    load.block_hashes = std::move(hashes);
    load.block_ids = std::move(ids);
    load.load_spec = LoadSpec{.vllm_cached_tokens = 0,
                              .kvpool_cached_tokens = load.token_len_chunk, .can_load = true};
    return load;
  };
  StepMetadata step;
  step.requests.push_back(load_request("a", {"h0"}, {0}));
  step.requests.push_back(load_request("b", {"h1", "h9"}, {2, 3}));  // h9 was never stored
  ASSERT_TRUE(worker->StartLoadKv(step).ok());
  // Loaded before GetFinished, in one call for both requests.
  EXPECT_THAT(transfer->loaded_ids, UnorderedElementsAre(0, 2, 3));
  const size_t block = kBlockSize * kHeads * kHeadDim;
  EXPECT_EQ(l0.data[0 * block], original0[4 * block]);
  EXPECT_EQ(l0.data[2 * block + 7], original0[1 * block + 7]);
  EXPECT_TRUE(worker->WaitForLayerLoad(1, 0).ok());
  EXPECT_TRUE(worker->WaitForLayerLoad(40, 0).ok());  // past the last layer: the last
  EXPECT_EQ(worker->WaitForLayerLoad(-1, 0).code(), absl::StatusCode::kInvalidArgument);

  absl::StatusOr<StoreWorker::Finished> finished = worker->GetFinished({}, std::move(step));
  ASSERT_TRUE(finished.ok());
  worker->WaitIdle();
  EXPECT_THAT(finished->recving, UnorderedElementsAre("a", "b"));
  EXPECT_THAT(transfer->loaded_ids, UnorderedElementsAre(0, 2, 3)) << "loaded twice";
  EXPECT_THAT(worker->TakeFailedLoadBlockIds(), UnorderedElementsAre(3));
  EXPECT_EQ(worker->receiver()->stats().keys_loaded, 2u);

  // The next step's GetFinished loads through the receiving thread again.
  StepMetadata again;
  again.requests.push_back(load_request("c", {"h0"}, {5}));
  ASSERT_TRUE(worker->GetFinished({}, std::move(again)).ok());
  worker->WaitIdle();
  EXPECT_THAT(transfer->loaded_ids, UnorderedElementsAre(0, 2, 3, 5));
}

TEST(StoreWorkerTest, DeviceRegistrationReportsTheTransferFactorysError) {
  FakeStore store;
  Layer l0;
  std::unique_ptr<StoreWorker> worker = *StoreWorker::Create(store, Options());
  absl::Status status = worker->RegisterDeviceKvCaches(
      {l0.Desc()}, kBlocks, [](const KvCacheLayout&) -> absl::StatusOr<std::unique_ptr<BlockTransfer>> {
        return absl::InternalError("no CUDA device");
      });
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal);
  EXPECT_FALSE(worker->layout().has_value());
  // A refused layout never reaches the factory.
  bool called = false;
  TensorDesc bad = l0.Desc();
  bad.storage_bytes -= 4;
  EXPECT_EQ(worker
                ->RegisterDeviceKvCaches({bad}, kBlocks,
                                         [&](const KvCacheLayout&)
                                             -> absl::StatusOr<std::unique_ptr<BlockTransfer>> {
                                           called = true;
                                           return absl::InternalError("unreachable");
                                         })
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(called);
}

}  // namespace
}  // namespace kvpool::engine
