#pragma once

// The worker side of a KV connector over the pool: what one engine worker process (one GPU,
// one tensor/pipeline-parallel rank) runs, as vLLM MooncakeStoreConnector's
// MooncakeStoreWorker does. It
//   - registers the engine's KV cache tensors (layout detection, kv_cache_layout.h) and
//     their storages with the store,
//   - keeps the token database that names chunks and addresses their blocks,
//   - stores chunks in a sending thread (kv_sender.h: existence check first, TP striding,
//     ready event, pressure back-off) and loads them in a receiving thread (kv_receiver.h),
//   - reports finished stores and loads per scheduler step (GetFinished), and
//   - answers how many prefix tokens of a request the pool holds for every TP and PP rank
//     (Lookup).
//
// Thread-safety: RegisterKvCaches, GetFinished and Stop are called from the engine's worker
// thread (one at a time); Lookup may be called from any thread at any time.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "engine_plugin/block_transfer.h"
#include "engine_plugin/kv_cache_layout.h"
#include "engine_plugin/kv_receiver.h"
#include "engine_plugin/kv_sender.h"
#include "engine_plugin/request.h"
#include "engine_plugin/store_backend.h"
#include "engine_plugin/token_database.h"

namespace kvpool::engine {

// vLLM's kv_role: producers store, consumers load, both do both.
enum class KvRole { kProducer, kConsumer, kBoth };

// "kv_producer", "kv_consumer", "kv_both"; InvalidArgument otherwise.
absl::StatusOr<KvRole> ParseKvRole(absl::string_view role);

struct StoreWorkerOptions {
  // Model name or path; keys use its last path component.
  std::string model_name;
  int tp_rank = 0;
  int tp_size = 1;
  int pp_rank = 0;
  int pp_size = 1;
  // Prefill / decode context parallelism: the key's pcp/dcp ranks; sizes above 1 scale the
  // chunk size (block_size * pcp_size * dcp_size tokens).
  int pcp_rank = 0;
  int pcp_size = 1;
  int dcp_rank = 0;
  int dcp_size = 1;
  // Total KV heads of the model (ignored with use_mla, which has one). When there are fewer
  // heads than TP ranks, ranks holding the same heads share keys and split the stores.
  int num_kv_heads = 1;
  bool use_mla = false;
  // The engine's block size in tokens.
  uint32_t block_size = 16;
  KvRole kv_role = KvRole::kBoth;
};

class StoreWorker {
 public:
  // InvalidArgument for ranks outside their sizes, sizes or head counts below 1, a block size
  // of 0, or an empty model name. `store` must outlive the worker.
  static absl::StatusOr<std::unique_ptr<StoreWorker>> Create(StoreBackend& store,
                                                             StoreWorkerOptions options);
  ~StoreWorker();
  StoreWorker(const StoreWorker&) = delete;
  StoreWorker& operator=(const StoreWorker&) = delete;

  // Registers one tensor per layer (KvCacheLayout::Detect's errors), registers each distinct
  // storage with the store once, and starts the threads. FailedPrecondition if called twice;
  // the store's error if a registration fails.
  absl::Status RegisterKvCaches(absl::Span<const TensorDesc> tensors, uint64_t num_blocks);
  // One tensor holding every layer per block (vLLM's cross-layer blocks).
  absl::Status RegisterCrossLayerKvCache(const TensorDesc& tensor, uint64_t num_blocks);
  // Builds the BlockTransfer of a device cache from its detected layout (for a GPU cache,
  // GpuBlockMover::Create over the store's client).
  using TransferFactory =
      std::function<absl::StatusOr<std::unique_ptr<BlockTransfer>>(const KvCacheLayout&)>;
  // Registers tensors in device memory (a GPU cache, per layer or one cross-layer tensor):
  // the layout is detected as for RegisterKvCaches, nothing is registered with the store
  // (it never touches that memory), and every block moves through the transfer that
  // `make_transfer` builds for the layout. Detect's errors, the factory's error as it is,
  // FailedPrecondition if called twice.
  absl::Status RegisterDeviceKvCaches(absl::Span<const TensorDesc> tensors, uint64_t num_blocks,
                                      const TransferFactory& make_transfer);
  // For engines that compute the segments themselves; no regions are registered. With a
  // transfer, blocks move through it instead of the store's gather-puts and scatter-gets.
  absl::Status RegisterLayout(const KvCacheLayout& layout,
                              std::unique_ptr<BlockTransfer> transfer = nullptr);

  struct Finished {
    absl::flat_hash_set<std::string> sending;  // stores done: the engine may free the blocks
    absl::flat_hash_set<std::string> recving;  // loads done: the KV is in the blocks
  };
  // Issues the step's loads and stores, then reports what has completed since the last step
  // (vLLM's get_finished). `finished_req_ids`: requests the engine finished in this step.
  // FailedPrecondition before registration.
  absl::StatusOr<Finished> GetFinished(const absl::flat_hash_set<std::string>& finished_req_ids,
                                       StepMetadata meta);

  // Layer-wise loading (vLLM's start_load_kv and wait_for_layer_load): starts the loads of
  // `meta`'s requests now, on this thread, layer by layer (BlockTransfer::StartLayerwiseLoad),
  // so that the step's forward pass computes layer i while later layers arrive. The next
  // GetFinished does not load these requests again; it waits for them and reports them
  // (finished, failed blocks) as it reports the receiving thread's loads. A request already
  // started is skipped. FailedPrecondition before registration.
  absl::Status StartLoadKv(const StepMetadata& meta);
  // Makes `stream` (a cudaStream_t as an integer) wait until layer `layer` (the registered
  // tensors' order) of the loads StartLoadKv started last has landed; the calling thread does
  // not block, and a CUDA graph captured on `stream` (even before any load) waits so at every
  // replay. A host cache's loads are complete when started (nothing to wait for).
  absl::Status WaitForLayerLoad(int layer, uintptr_t stream);

  // How many leading tokens of a request (its first `token_len` tokens, named by
  // `block_hashes`) the pool holds for every TP rank (as many as hold distinct KV heads) and
  // every PP rank: the start of the first chunk missing for any rank, or the end of the last
  // chunk if none is. A store that cannot answer counts as missing. This rank's own keys are
  // asked of the block transfer when it locates (BlockTransfer::Locate), which keeps their
  // leased locations for the load that follows; the others of the store (BatchExist).
  uint64_t Lookup(uint64_t token_len, absl::Span<const std::string> block_hashes) const;

  // Block ids whose load failed since the last call (the engine should recompute them).
  absl::flat_hash_set<int64_t> TakeFailedLoadBlockIds();

  // Waits until both threads have handled everything queued.
  void WaitIdle();
  // Finishes what is queued and stops the threads. Safe to call twice.
  void Stop();

  uint32_t block_size() const { return token_database_.block_size(); }
  int put_step() const { return put_step_; }
  const KeyMetadata& key_metadata() const { return token_database_.metadata(); }
  const TokenDatabase& token_database() const { return token_database_; }
  const std::optional<KvCacheLayout>& layout() const { return layout_; }
  // Whether blocks move through a BlockTransfer (a device cache).
  bool has_transfer() const { return transfer_ != nullptr; }
  // Null before registration, and for the sender of a kv_consumer.
  const KvSender* sender() const { return sender_.get(); }
  const KvReceiver* receiver() const { return receiver_.get(); }

 private:
  StoreWorker(StoreBackend& store, StoreWorkerOptions options, int put_step, KeyMetadata metadata,
              uint32_t block_size);
  bool stores() const { return options_.kv_role != KvRole::kConsumer; }
  static std::optional<ReqMeta> LoadOf(const ReqMeta& request, uint64_t block_size);
  absl::flat_hash_set<std::string> FinishedSending(
      const absl::flat_hash_set<std::string>& finished_req_ids, const StepMetadata& meta);

  StoreBackend& store_;
  const StoreWorkerOptions options_;
  const int put_step_;
  TokenDatabase token_database_;
  std::optional<KvCacheLayout> layout_;
  // Declared before the threads, so it outlives them.
  std::unique_ptr<BlockTransfer> transfer_;
  std::unique_ptr<KvSender> sender_;
  std::unique_ptr<KvReceiver> receiver_;
  // Requests StartLoadKv started since the last GetFinished.
  absl::flat_hash_set<std::string> layerwise_started_;
  // Finished requests whose stores were still pending when they finished.
  absl::flat_hash_set<std::string> finished_store_req_;
};

}  // namespace kvpool::engine
