#pragma once

// The receiving thread: loads KV chunks from the pool into the engine's registered blocks in
// the background, like vLLM MooncakeStoreConnector's KVCacheStoreRecvingThread.
//
// Per request (HandleRequest): the chunks of tokens [mask, load_spec.token_len), where mask
// is load_spec.vllm_cached_tokens rounded down to a block (the engine has those already);
// the list is rotated by tp_rank so that tensor-parallel ranks start on different chunks;
// then one batched multi-buffer get scatters each chunk's value over the segments of its
// block. The request is reported finished whether or not every key was read: failed keys
// are logged and their block ids kept for TakeFailedBlockIds, so the engine can recompute
// them instead of using stale KV.
//
// Layer-wise loads (StartLayerwise, WaitForLayer, FinishLayerwise) run on the caller's thread
// instead: the chunks are planned the same way and handed to BlockTransfer::StartLayerwiseLoad,
// so the engine computes layer i while later layers arrive; FinishLayerwise reports them like
// the thread's loads (finished requests, failed block ids).
//
// Thread-safe. The StoreBackend and TokenDatabase must outlive the receiver.

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "common/queue_worker.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "engine_plugin/block_transfer.h"
#include "engine_plugin/request.h"
#include "engine_plugin/store_backend.h"
#include "engine_plugin/token_database.h"

namespace kvpool::engine {

struct KvReceiverOptions {
  int tp_rank = 0;
  // Moves the blocks instead of the store's BatchGet (a cache in GPU memory); must outlive
  // the receiver. Null: the cache is host memory the store writes itself.
  BlockTransfer* transfer = nullptr;
};

struct KvReceiverStats {
  uint64_t requests = 0;    // requests handled
  uint64_t batches = 0;     // BatchGet calls
  uint64_t keys_loaded = 0;
  uint64_t bytes_loaded = 0;
  uint64_t keys_failed = 0;
};

class KvReceiver {
 public:
  KvReceiver(StoreBackend& store, const TokenDatabase& token_database, KvReceiverOptions options);
  ~KvReceiver();
  KvReceiver(const KvReceiver&) = delete;
  KvReceiver& operator=(const KvReceiver&) = delete;

  void Start() ABSL_LOCKS_EXCLUDED(mu_);
  // Handles what is already queued, then stops the thread. Safe to call twice.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

  // `request.load_spec` must be set, with token_len filled in.
  void Enqueue(ReqMeta request) ABSL_LOCKS_EXCLUDED(mu_);
  void HandleRequest(const ReqMeta& request) ABSL_LOCKS_EXCLUDED(mu_);
  void WaitIdle() ABSL_LOCKS_EXCLUDED(mu_);

  // Requests whose loads completed since the last call.
  absl::flat_hash_set<std::string> TakeFinished() ABSL_LOCKS_EXCLUDED(mu_);
  // Block ids whose load failed since the last call.
  absl::flat_hash_set<int64_t> TakeFailedBlockIds() ABSL_LOCKS_EXCLUDED(mu_);
  KvReceiverStats stats() const ABSL_LOCKS_EXCLUDED(mu_);

  // Starts the requests' loads as one load, layer by layer, now, on this thread (through the
  // transfer; a host cache is loaded whole before this returns). Each `load_spec` as for
  // Enqueue.
  void StartLayerwise(absl::Span<const ReqMeta> requests) ABSL_LOCKS_EXCLUDED(mu_, layerwise_mu_);
  // Makes `stream` wait for layer `layer` of the latest layer-wise load (the transfer's
  // WaitForLayer; a host cache's loads are complete when started). Also while `stream` is
  // captured into a CUDA graph, with no load started yet.
  absl::Status WaitForLayer(int layer, uintptr_t stream);
  // Waits for the layer-wise loads started and reports them as the thread's loads are.
  void FinishLayerwise() ABSL_LOCKS_EXCLUDED(mu_, layerwise_mu_);

 private:
  // A request's chunks (Step L1, L2): their gets and their block ids, in the same order. With
  // a block transfer the gets carry keys only (the transfer addresses blocks by id).
  struct PlannedLoad {
    std::vector<GetItem> items;
    std::vector<int64_t> blocks;
  };
  struct Layerwise {
    std::vector<std::pair<std::string, PlannedLoad>> requests;  // in the load's key order
    std::unique_ptr<LayerwiseLoad> load;
  };
  PlannedLoad Plan(const ReqMeta& request) const;
  static void TransferArgs(const PlannedLoad& plan, std::vector<std::string>& keys,
                           std::vector<int32_t>& ids);
  // A transfer's statuses as BatchGet's results (a block's bytes where OK).
  std::vector<absl::StatusOr<uint64_t>> ToResults(std::vector<absl::Status> statuses);
  // Counts a request's results, keeps its failed blocks, marks it finished.
  void Record(const std::string& req_id, const PlannedLoad& plan,
              const std::vector<absl::StatusOr<uint64_t>>& results) ABSL_LOCKS_EXCLUDED(mu_);

  StoreBackend& store_;
  const TokenDatabase& token_database_;
  const KvReceiverOptions options_;

  mutable absl::Mutex mu_;
  absl::flat_hash_set<std::string> finished_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<int64_t> failed_block_ids_ ABSL_GUARDED_BY(mu_);
  KvReceiverStats stats_ ABSL_GUARDED_BY(mu_);
  absl::Mutex layerwise_mu_;
  std::vector<Layerwise> layerwise_ ABSL_GUARDED_BY(layerwise_mu_);
  // Handles the enqueued requests, one at a time, in order.
  QueueWorker<ReqMeta> worker_{[this](ReqMeta& request) { HandleRequest(request); }};
};

}  // namespace kvpool::engine
