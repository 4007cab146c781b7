#include "engine_plugin/kv_sender.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/log.h"
#include "kvpool/v1/common.pb.h"

namespace kvpool::engine {

KvSender::KvSender(StoreBackend& store, const TokenDatabase& token_database,
                   KvSenderOptions options)
    : store_(store),
      token_database_(token_database),
      options_{.tp_rank = std::max(options.tp_rank, 0),
               // StoreWorker checks it; never divide by 0 here.
               .put_step = std::max(options.put_step, 1),
               .transfer = options.transfer} {}

KvSender::~KvSender() { Stop(); }

void KvSender::Start() { worker_.Start(); }

void KvSender::Stop() { worker_.Stop(); }


void KvSender::AddStoredRequest(const std::string& req_id) {
  absl::MutexLock lock(&mu_);
  ++stored_requests_[req_id];
}

void KvSender::Enqueue(ReqMeta request) { worker_.Push(std::move(request)); }

void KvSender::WaitIdle() { worker_.WaitIdle(); }

std::optional<int> KvSender::PendingJobs(const std::string& req_id) const {
  absl::MutexLock lock(&mu_);
  auto it = stored_requests_.find(req_id);
  if (it == stored_requests_.end()) return std::nullopt;
  return it->second;
}

absl::flat_hash_map<std::string, int> KvSender::StoredRequests() const {
  absl::MutexLock lock(&mu_);
  return stored_requests_;
}

void KvSender::DecStoredRequest(const std::string& req_id) {
  absl::MutexLock lock(&mu_);
  auto it = stored_requests_.find(req_id);
  if (it != stored_requests_.end()) --it->second;
}

void KvSender::DeleteFinishedStoredRequest(const std::string& req_id) {
  absl::MutexLock lock(&mu_);
  stored_requests_.erase(req_id);
  skip_requests_.erase(req_id);
}

bool KvSender::ShouldSkip(const std::string& req_id) const {
  absl::MutexLock lock(&mu_);
  return pressure_active_ && skip_requests_.contains(req_id);
}

bool KvSender::MarkSkippedForPressure(const std::string& req_id) {
  absl::MutexLock lock(&mu_);
  pressure_active_ = true;
  return !skip_requests_.insert(req_id).second;
}

bool KvSender::ClearPressure() {
  absl::MutexLock lock(&mu_);
  if (!pressure_active_ && skip_requests_.empty()) return false;
  pressure_active_ = false;
  skip_requests_.clear();
  return true;
}

bool KvSender::store_pressure_active() const {
  absl::MutexLock lock(&mu_);
  return pressure_active_;
}

bool KvSender::IsSkippedForPressure(const std::string& req_id) const {
  absl::MutexLock lock(&mu_);
  return skip_requests_.contains(req_id);
}

KvSenderStats KvSender::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

void KvSender::HandleRequest(const ReqMeta& request) {
  const std::string& req_id = request.req_id;
  {
    absl::MutexLock lock(&mu_);
    ++stats_.requests;
    // Finished or preempted since it was queued: nothing to do, nobody waits for it.
    if (!stored_requests_.contains(req_id)) return;
  }
  if (ShouldSkip(req_id)) {
    KVPOOL_LOG(DEBUG) << "skipping the store of request " << req_id
                      << " while the pool is under pressure";
    {
      absl::MutexLock lock(&mu_);
      ++stats_.skipped_for_pressure;
    }
    DecStoredRequest(req_id);
    return;
  }

  // Step S1: this rank's chunks of the request.
  std::vector<TokenChunk> chunks;
  {
    std::vector<TokenChunk> all =
        token_database_.ProcessTokens(request.token_len_chunk, request.block_hashes);
    const size_t step = static_cast<size_t>(options_.put_step);
    for (size_t i = static_cast<size_t>(options_.tp_rank) % step; i < all.size(); i += step) {
      chunks.push_back(std::move(all[i]));
    }
  }
  if (chunks.empty()) {
    DecStoredRequest(req_id);
    return;
  }

  // Step S2: only what the pool does not have yet.
  std::vector<std::string> keys;
  keys.reserve(chunks.size());
  for (const TokenChunk& chunk : chunks) keys.push_back(chunk.key);
  std::vector<absl::StatusOr<bool>> exists = store_.BatchExist(keys);
  std::vector<TokenChunk> missing;
  for (size_t i = 0; i < chunks.size(); ++i) {
    bool present = i < exists.size() && exists[i].ok() && *exists[i];
    if (!present) missing.push_back(std::move(chunks[i]));
  }
  {
    absl::MutexLock lock(&mu_);
    stats_.keys_checked += keys.size();
    stats_.keys_present += keys.size() - missing.size();
  }
  if (missing.empty()) {
    DecStoredRequest(req_id);
    return;
  }

  // Step S3: the buffers of every missing chunk, gathered over the segments.
  std::vector<PutItem> items;
  std::vector<uint64_t> item_bytes;
  std::vector<int32_t> item_blocks;  // with a BlockTransfer: whole blocks by id
  items.reserve(missing.size());
  for (TokenChunk& chunk : missing) {
    if (options_.transfer != nullptr) {
      // The transfer moves whole blocks by id: no per-segment buffers to address.
      absl::StatusOr<int64_t> block =
          token_database_.BlockOf(chunk.start, chunk.end, request.block_ids);
      if (!block.ok()) {
        KVPOOL_LOG(ERROR) << "request " << req_id << ": cannot address chunk " << chunk.key
                          << ": " << block.status().message();
        continue;
      }
      item_bytes.push_back(token_database_.ChunkBytes(chunk.start, chunk.end));
      item_blocks.push_back(static_cast<int32_t>(*block));
      items.push_back(PutItem{.key = std::move(chunk.key), .parts = {}});
      continue;
    }
    absl::StatusOr<ChunkBuffers> buffers =
        token_database_.PrepareValue(chunk.start, chunk.end, request.block_ids);
    if (!buffers.ok()) {
      KVPOOL_LOG(ERROR) << "request " << req_id << ": cannot address chunk " << chunk.key << ": "
                        << buffers.status().message();
      continue;
    }
    PutItem item{.key = chunk.key, .parts = {}};
    item.parts.reserve(buffers->addrs.size());
    for (size_t s = 0; s < buffers->addrs.size(); ++s) {
      item.parts.push_back(ConstBuffer{reinterpret_cast<const void*>(buffers->addrs[s]),
                                       static_cast<size_t>(buffers->sizes[s])});
    }
    item_bytes.push_back(buffers->total_bytes());
    item_blocks.push_back(static_cast<int32_t>(buffers->block_id));
    items.push_back(std::move(item));
  }
  if (items.empty()) {
    DecStoredRequest(req_id);
    return;
  }

  // Step S4: the engine must have written the blocks before they are read.
  if (request.ready_event != nullptr) {
    if (absl::Status ready = request.ready_event->Wait(); !ready.ok()) {
      KVPOOL_LOG(ERROR) << "request " << req_id << ": not storing, its ready event failed: "
                        << ready.message();
      DecStoredRequest(req_id);
      return;
    }
  }

  // Step S5: one batched multi-buffer put, then the back-off rule.
  std::vector<absl::Status> results;
  if (options_.transfer != nullptr) {
    std::vector<std::string> keys_to_store;
    keys_to_store.reserve(items.size());
    for (const PutItem& item : items) keys_to_store.push_back(item.key);
    results = options_.transfer->StoreBlocks(keys_to_store, item_blocks);
  } else {
    results = store_.BatchPut(items);
  }
  size_t failed = 0;
  size_t no_space = 0;
  uint64_t stored_bytes = 0;
  size_t stored = 0;
  absl::flat_hash_set<std::string> codes;
  for (size_t i = 0; i < items.size(); ++i) {
    absl::Status status = i < results.size() ? results[i] : absl::InternalError("no result");
    if (status.ok()) {
      ++stored;
      stored_bytes += item_bytes[i];
    } else if (absl::IsAlreadyExists(status)) {
      ++stored;
    } else {
      ++failed;
      if (ToErrorCode(status) == v1::NO_AVAILABLE_HANDLE) ++no_space;
      codes.insert(ErrorCodeName(ToErrorCode(status)));
    }
  }
  {
    absl::MutexLock lock(&mu_);
    ++stats_.batches;
    stats_.keys_stored += stored;
    stats_.bytes_stored += stored_bytes;
    stats_.keys_failed += failed;
    stats_.keys_no_space += no_space;
  }
  if (failed > 0) {
    uint64_t batch_bytes = 0;
    for (uint64_t bytes : item_bytes) batch_bytes += bytes;
    KVPOOL_LOG(WARNING) << "batch put failed: " << failed << "/" << items.size()
                        << " keys failed (codes=" << absl::StrJoin(codes, ",")
                        << ", batch_bytes=" << batch_bytes << "), first_key=" << items[0].key;
    if (no_space > 0 && !MarkSkippedForPressure(req_id)) {
      KVPOOL_LOG(WARNING) << "the pool is under pressure (NO_AVAILABLE_HANDLE); skipping further "
                             "stores of request "
                          << req_id << " until a later store batch succeeds";
    }
  } else if (ClearPressure()) {
    KVPOOL_LOG(INFO) << "pool pressure cleared after a successful store batch";
  }
  DecStoredRequest(req_id);
}

}  // namespace kvpool::engine
