// The engine plugin against real pool processes: kvpool-master (and kvpool-segment) started
// on free loopback ports. KV blocks of host-memory "caches" are stored, the caches zeroed, and
// loaded back; duplicates are never sent; lookups see every rank's keys; a full pool makes
// the sender back off.

#include <cstring>
#include <numeric>
#include <random>

#include "engine_plugin/notified_ready_event.h"
#include "engine_plugin/store.h"
#include "engine_plugin/store_worker.h"
#include "engine_plugin/testing/requests.h"
#include "tests/harness/cluster.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvpool::engine {
namespace {

using ::testing::UnorderedElementsAre;

constexpr uint32_t kBlockSize = 16;
constexpr uint64_t kBlocks = 32;
constexpr int64_t kHeads = 2;
constexpr int64_t kHeadDim = 32;

// A FlashAttention-style layer, (2, blocks, block_size, heads, head_dim) of fp16 (as bytes),
// filled with random bytes.
struct Layer {
  explicit Layer(uint32_t seed) : bytes(2 * kBlocks * kBlockSize * kHeads * kHeadDim * 2) {
    std::mt19937 rng(seed);
    for (uint8_t& b : bytes) b = static_cast<uint8_t>(rng());
  }
  TensorDesc Desc() const {
    TensorDesc t;
    t.data_ptr = reinterpret_cast<uint64_t>(bytes.data());
    t.storage_ptr = t.data_ptr;
    t.storage_bytes = bytes.size();
    t.shape = {2, kBlocks, kBlockSize, kHeads, kHeadDim};
    t.strides = {kBlocks * kBlockSize * kHeads * kHeadDim, kBlockSize * kHeads * kHeadDim,
                 kHeads * kHeadDim, kHeadDim, 1};
    t.element_size = 2;
    return t;
  }
  std::vector<uint8_t> bytes;
};

std::vector<std::string> Hashes(const std::string& prefix, int n) {
  std::vector<std::string> hashes;
  for (int i = 0; i < n; ++i) hashes.push_back(HexHash(prefix + std::to_string(i)));
  return hashes;
}

ReqMeta Save(const std::string& id, std::vector<std::string> hashes,
             std::vector<int64_t> block_ids) {
  return testing::SaveRequest(id, std::move(hashes), std::move(block_ids), kBlockSize);
}

ReqMeta Load(const std::string& id, std::vector<std::string> hashes,
             std::vector<int64_t> block_ids) {
  ReqMeta r;
  r.req_id = id;
  r.token_len_chunk = hashes.size() * kBlockSize;
  r.block_hashes = std::move(hashes);
  r.block_ids = std::move(block_ids);
  r.load_spec = LoadSpec{.vllm_cached_tokens = 0,
                         .kvpool_cached_tokens = r.token_len_chunk,
                         .can_load = true};
  return r;
}

// Runs one scheduler step and waits for the threads, returning everything reported finished.
StoreWorker::Finished Step(StoreWorker& worker, StepMetadata meta,
                           const absl::flat_hash_set<std::string>& finished = {}) {
  meta.store_ready = std::make_shared<NotifiedReadyEvent>(/*ready=*/true);
  absl::StatusOr<StoreWorker::Finished> first = worker.GetFinished(finished, std::move(meta));
  EXPECT_TRUE(first.ok()) << first.status();
  worker.WaitIdle();
  absl::StatusOr<StoreWorker::Finished> second = worker.GetFinished({}, {});
  first->sending.insert(second->sending.begin(), second->sending.end());
  first->recving.insert(second->recving.begin(), second->recving.end());
  return *first;
}

StepMetadata With(ReqMeta request) {
  StepMetadata meta;
  meta.requests.push_back(std::move(request));
  return meta;
}

StoreWorkerOptions Options(int tp_rank = 0, int tp_size = 1) {
  return StoreWorkerOptions{.model_name = "integration-model", .tp_rank = tp_rank,
                            .tp_size = tp_size, .num_kv_heads = kHeads, .block_size = kBlockSize};
}

std::unique_ptr<Store> OpenStore(const std::string& master, const std::string& segment_size) {
  absl::StatusOr<StoreConfig> config = ParseStoreConfig(
      {{"master_server_address", master}, {"global_segment_size", segment_size},
       {"local_hostname", std::string("127.0.0.1")}, {"protocol", std::string("tcp")}});
  EXPECT_TRUE(config.ok()) << config.status();
  absl::StatusOr<std::unique_ptr<Store>> store = Store::Open(*config);
  EXPECT_TRUE(store.ok()) << store.status();
  return store.ok() ? std::move(*store) : nullptr;
}

class EngineIntegrationTest : public ::testing::Test {
 protected:
  void StartPool(const std::string& embedded_size, bool with_segment_process) {
    absl::StatusOr<kvpool::testing::MasterProcess> master =
        kvpool::testing::StartMaster({"--embedded-segment-size=" + embedded_size});
    ASSERT_TRUE(master.ok()) << master.status();
    master_ = std::move(*master);
    if (with_segment_process) {
      absl::StatusOr<kvpool::testing::SegmentProcess> segment =
          kvpool::testing::StartSegment(master_.grpc, "64MiB");
      ASSERT_TRUE(segment.ok()) << segment.status();
      segment_ = std::move(*segment);
    }
  }

  kvpool::testing::MasterProcess master_;
  kvpool::testing::SegmentProcess segment_;
};

TEST_F(EngineIntegrationTest, StoreZeroLoadRestoresIdenticalBytes) {
  StartPool("0", /*with_segment_process=*/true);
  std::unique_ptr<Store> store = OpenStore(master_.grpc, "0");
  ASSERT_NE(store, nullptr);
  Layer l0(1), l1(2);
  const std::vector<uint8_t> original0 = l0.bytes, original1 = l1.bytes;
  std::unique_ptr<StoreWorker> worker = *StoreWorker::Create(*store, Options());
  ASSERT_TRUE(worker->RegisterKvCaches({l0.Desc(), l1.Desc()}, kBlocks).ok());
  EXPECT_EQ(store->RegisteredBuffers().size(), 2u);

  std::vector<std::string> hashes = Hashes("prompt-a/", 5);
  std::vector<int64_t> blocks = {9, 3, 17, 30, 0};
  StoreWorker::Finished done = Step(*worker, With(Save("req-a", hashes, blocks)), {"req-a"});
  EXPECT_THAT(done.sending, UnorderedElementsAre("req-a"));
  EXPECT_EQ(worker->sender()->stats().keys_stored, 5u);
  EXPECT_EQ(worker->Lookup(5 * kBlockSize, hashes), 5 * kBlockSize);

  std::fill(l0.bytes.begin(), l0.bytes.end(), 0);
  std::fill(l1.bytes.begin(), l1.bytes.end(), 0);
  done = Step(*worker, With(Load("req-b", hashes, blocks)));
  EXPECT_THAT(done.recving, UnorderedElementsAre("req-b"));
  EXPECT_TRUE(worker->TakeFailedLoadBlockIds().empty());

  const size_t block_bytes = kBlockSize * kHeads * kHeadDim * 2;
  for (size_t kv = 0; kv < 2; ++kv) {
    for (int64_t b : blocks) {
      size_t offset = (kv * kBlocks + static_cast<size_t>(b)) * block_bytes;
      ASSERT_EQ(std::memcmp(l0.bytes.data() + offset, original0.data() + offset, block_bytes), 0);
      ASSERT_EQ(std::memcmp(l1.bytes.data() + offset, original1.data() + offset, block_bytes), 0);
    }
  }
  worker->Stop();
}

TEST_F(EngineIntegrationTest, SecondStoreOfTheSameChunksSendsNoBytes) {
  StartPool("0", /*with_segment_process=*/false);
  // The pool's only memory is a segment inside this process, so its counters see every byte.
  std::unique_ptr<Store> store = OpenStore(master_.grpc, "16MiB");
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->local_segment_stats().has_value());
  Layer l0(3);
  std::unique_ptr<StoreWorker> worker = *StoreWorker::Create(*store, Options());
  ASSERT_TRUE(worker->RegisterKvCaches({l0.Desc()}, kBlocks).ok());
  std::vector<std::string> hashes = Hashes("dedup/", 4);

  Step(*worker, With(Save("first", hashes, {0, 1, 2, 3})), {"first"});
  const uint64_t chunk_bytes = worker->layout()->bytes_per_block();
  EXPECT_EQ(store->local_segment_stats()->bytes_written, 4 * chunk_bytes);
  absl::StatusOr<ClusterStatus> before = store->GetClusterStatus();
  ASSERT_TRUE(before.ok());

  Step(*worker, With(Save("second", hashes, {4, 5, 6, 7})), {"second"});
  EXPECT_EQ(store->local_segment_stats()->bytes_written, 4 * chunk_bytes);
  EXPECT_EQ(worker->sender()->stats().keys_present, 4u);
  EXPECT_EQ(worker->sender()->stats().batches, 1u);
  absl::StatusOr<ClusterStatus> after = store->GetClusterStatus();
  EXPECT_EQ(after->objects, before->objects);
  EXPECT_EQ(after->used_bytes, before->used_bytes);

  // One more chunk: only it is sent.
  std::vector<std::string> longer = Hashes("dedup/", 5);
  Step(*worker, With(Save("third", longer, {0, 1, 2, 3, 8})), {"third"});
  EXPECT_EQ(store->local_segment_stats()->bytes_written, 5 * chunk_bytes);
  worker->Stop();
}

TEST_F(EngineIntegrationTest, LookupCountsOnlyWhatEveryTpRankHas) {
  StartPool("64MiB", /*with_segment_process=*/false);
  std::unique_ptr<Store> store0 = OpenStore(master_.grpc, "0");
  std::unique_ptr<Store> store1 = OpenStore(master_.grpc, "0");
  ASSERT_NE(store0, nullptr);
  ASSERT_NE(store1, nullptr);
  Layer cache0(4), cache1(5);
  std::unique_ptr<StoreWorker> rank0 = *StoreWorker::Create(*store0, Options(0, 2));
  std::unique_ptr<StoreWorker> rank1 = *StoreWorker::Create(*store1, Options(1, 2));
  ASSERT_TRUE(rank0->RegisterKvCaches({cache0.Desc()}, kBlocks).ok());
  ASSERT_TRUE(rank1->RegisterKvCaches({cache1.Desc()}, kBlocks).ok());

  std::vector<std::string> hashes = Hashes("shared-prefix/", 6);
  std::vector<int64_t> blocks = {0, 1, 2, 3, 4, 5};
  Step(*rank0, With(Save("r", hashes, blocks)), {"r"});
  EXPECT_EQ(rank0->Lookup(6 * kBlockSize, hashes), 0u);  // rank 1 has nothing yet

  // Rank 1 stores only the first four chunks.
  std::vector<std::string> first4(hashes.begin(), hashes.begin() + 4);
  Step(*rank1, With(Save("r", first4, blocks)), {"r"});
  EXPECT_EQ(rank0->Lookup(6 * kBlockSize, hashes), 4 * kBlockSize);
  EXPECT_EQ(rank1->Lookup(6 * kBlockSize, hashes), 4 * kBlockSize);

  Step(*rank1, With(Save("r2", hashes, blocks)), {"r2"});
  EXPECT_EQ(rank0->Lookup(6 * kBlockSize, hashes), 6 * kBlockSize);
  EXPECT_EQ(rank0->Lookup(5 * kBlockSize + 3, hashes), 5 * kBlockSize + 3);
}

TEST_F(EngineIntegrationTest, FullPoolMakesTheSenderBackOffUntilAStoreSucceeds) {
  // A 256 KiB pool; each chunk is 2 * 16 * 2 * 32 * 2 = 4 KiB, so 64 chunks fill it.
  StartPool("256KiB", /*with_segment_process=*/false);
  std::unique_ptr<Store> store = OpenStore(master_.grpc, "0");
  ASSERT_NE(store, nullptr);
  Layer cache(6);
  std::unique_ptr<StoreWorker> worker = *StoreWorker::Create(*store, Options());
  ASSERT_TRUE(worker->RegisterKvCaches({cache.Desc()}, kBlocks).ok());
  std::vector<int64_t> blocks(kBlocks);
  std::iota(blocks.begin(), blocks.end(), 0);

  // Three quarters of the pool hold hard-pinned objects, which eviction never takes.
  ClientOptions client_options;
  client_options.master_address = master_.grpc;
  std::unique_ptr<Client> pinner = std::move(Client::Create(client_options).value());
  const std::string pinned(4096, 'p');
  for (int i = 0; i < 48; ++i) {
    ASSERT_TRUE(pinner->Put("pinned/" + std::to_string(i), pinned, {.pin = PinMode::kHard}).ok());
  }
  // The rest takes 16 chunks; 32 more find room only by evicting those 16 (unpinned, not
  // leased): the other 16 are pressure.
  Step(*worker, With(Save("filler", Hashes("fill-a/", 16), blocks)));
  Step(*worker, With(Save("big", Hashes("fill-b/", 32), blocks)));
  EXPECT_TRUE(worker->sender()->store_pressure_active());
  EXPECT_TRUE(worker->sender()->IsSkippedForPressure("big"));
  EXPECT_GT(worker->sender()->stats().keys_no_space, 0u);

  // Skipped while under pressure: no batch goes out for it.
  const uint64_t batches = worker->sender()->stats().batches;
  Step(*worker, With(Save("big", Hashes("fill-d/", 2), blocks)));
  EXPECT_EQ(worker->sender()->stats().batches, batches);
  EXPECT_EQ(worker->sender()->stats().skipped_for_pressure, 1u);

  // Space comes back; another request's successful store clears the pressure.
  ASSERT_TRUE(pinner->RemoveAll(/*force=*/true).ok());
  Step(*worker, With(Save("small", Hashes("small/", 2), blocks)));
  EXPECT_FALSE(worker->sender()->store_pressure_active());
  Step(*worker, With(Save("big", Hashes("fill-e/", 2), blocks)));
  EXPECT_EQ(worker->sender()->stats().batches, batches + 2);
}

}  // namespace
}  // namespace kvpool::engine
