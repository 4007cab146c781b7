#pragma once

// The sending thread: stores the KV chunks of requests into the pool in the background,
// behaving exactly like vLLM MooncakeStoreConnector's KVCacheStoreSendingThread.
//
// Per request (HandleRequest):
//   1. Dropped if its pending-job count is gone (finished or preempted meanwhile).
//   2. Skipped if the pool is under pressure and this request was marked for it.
//   3. Its chunks [0, token_len_chunk), strided over tensor-parallel ranks: this rank takes
//      chunks tp_rank % put_step, + put_step, ... (ranks that share KV heads split the work).
//   4. BatchExist first; chunks the pool already has are never sent.
//   5. The request's ready event is waited for, then the missing chunks go out as one
//      batched multi-buffer put (one object per chunk, gathered from every segment), or, with
//      a BlockTransfer (a GPU cache), as one StoreBlocks call of whole blocks.
//   6. Back-off: if any key of the batch failed with NO_AVAILABLE_HANDLE (ResourceExhausted),
//      the pool is marked under pressure and this request's later batches are skipped; the
//      first later batch with no failed key clears the mark (and every skipped request).
//      Other failure codes neither mark nor clear. AlreadyExists (another writer stored the
//      chunk between the check and the put) counts as stored, not as a failure.
//   7. The request's pending-job count is decremented.
//
// Thread-safe. The StoreBackend and TokenDatabase must outlive the sender.

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "common/queue_worker.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "engine_plugin/block_transfer.h"
#include "engine_plugin/request.h"
#include "engine_plugin/store_backend.h"
#include "engine_plugin/token_database.h"

namespace kvpool::engine {

struct KvSenderOptions {
  int tp_rank = 0;
  // Tensor-parallel ranks that hold the same KV heads split a request's chunks this many ways.
  int put_step = 1;
  // Moves the blocks instead of the store's BatchPut (a cache in GPU memory); must outlive
  // the sender. Null: the cache is host memory the store reads itself.
  BlockTransfer* transfer = nullptr;
};

struct KvSenderStats {
  uint64_t requests = 0;              // requests handled
  uint64_t skipped_for_pressure = 0;  // requests skipped because of the back-off
  uint64_t keys_checked = 0;          // keys sent to BatchExist
  uint64_t keys_present = 0;          // of those, already in the pool (not sent)
  uint64_t batches = 0;               // BatchPut calls
  uint64_t keys_stored = 0;           // keys put (or found stored by another writer)
  uint64_t bytes_stored = 0;          // bytes of the keys this sender wrote
  uint64_t keys_no_space = 0;         // keys refused with NO_AVAILABLE_HANDLE
  uint64_t keys_failed = 0;           // keys that failed for any reason (no space included)
};

class KvSender {
 public:
  KvSender(StoreBackend& store, const TokenDatabase& token_database, KvSenderOptions options);
  ~KvSender();
  KvSender(const KvSender&) = delete;
  KvSender& operator=(const KvSender&) = delete;

  // Starts the thread that handles enqueued requests.
  void Start() ABSL_LOCKS_EXCLUDED(mu_);
  // Handles what is already queued, then stops the thread. Safe to call twice.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

  // One more store job for `req_id`; call before Enqueue.
  void AddStoredRequest(const std::string& req_id) ABSL_LOCKS_EXCLUDED(mu_);
  void Enqueue(ReqMeta request) ABSL_LOCKS_EXCLUDED(mu_);
  // Handles one request on the calling thread (the thread's body; tests call it directly).
  void HandleRequest(const ReqMeta& request) ABSL_LOCKS_EXCLUDED(mu_);
  // Blocks until the queue is empty and no request is being handled.
  void WaitIdle() ABSL_LOCKS_EXCLUDED(mu_);

  // Store jobs not yet done for `req_id`, or nullopt if it has none on record.
  std::optional<int> PendingJobs(const std::string& req_id) const ABSL_LOCKS_EXCLUDED(mu_);
  // Every request on record with its pending job count.
  absl::flat_hash_map<std::string, int> StoredRequests() const ABSL_LOCKS_EXCLUDED(mu_);
  // Forgets `req_id` (finished or preempted), including its pressure mark.
  void DeleteFinishedStoredRequest(const std::string& req_id) ABSL_LOCKS_EXCLUDED(mu_);

  bool store_pressure_active() const ABSL_LOCKS_EXCLUDED(mu_);
  bool IsSkippedForPressure(const std::string& req_id) const ABSL_LOCKS_EXCLUDED(mu_);
  KvSenderStats stats() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void DecStoredRequest(const std::string& req_id) ABSL_LOCKS_EXCLUDED(mu_);
  bool ShouldSkip(const std::string& req_id) const ABSL_LOCKS_EXCLUDED(mu_);
  // Returns whether the request was already marked.
  bool MarkSkippedForPressure(const std::string& req_id) ABSL_LOCKS_EXCLUDED(mu_);
  // Returns whether there was anything to clear.
  bool ClearPressure() ABSL_LOCKS_EXCLUDED(mu_);

  StoreBackend& store_;
  const TokenDatabase& token_database_;
  const KvSenderOptions options_;

  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, int> stored_requests_ ABSL_GUARDED_BY(mu_);
  bool pressure_active_ ABSL_GUARDED_BY(mu_) = false;
  absl::flat_hash_set<std::string> skip_requests_ ABSL_GUARDED_BY(mu_);
  KvSenderStats stats_ ABSL_GUARDED_BY(mu_);
  // Handles the enqueued requests, one at a time, in order.
  QueueWorker<ReqMeta> worker_{[this](ReqMeta& request) { HandleRequest(request); }};
};

}  // namespace kvpool::engine
