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
// Thread-safe. The StoreBackend and TokenDatabase must outlive the receiver.

#include <cstdint>
#include <deque>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "common/queue_worker.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
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

 private:

  StoreBackend& store_;
  const TokenDatabase& token_database_;
  const KvReceiverOptions options_;

  mutable absl::Mutex mu_;
  absl::flat_hash_set<std::string> finished_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<int64_t> failed_block_ids_ ABSL_GUARDED_BY(mu_);
  KvReceiverStats stats_ ABSL_GUARDED_BY(mu_);
  // Handles the enqueued requests, one at a time, in order.
  QueueWorker<ReqMeta> worker_{[this](ReqMeta& request) { HandleRequest(request); }};
};

}  // namespace kvpool::engine
