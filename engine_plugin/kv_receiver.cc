#include "engine_plugin/kv_receiver.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/log.h"

namespace kvpool::engine {

KvReceiver::KvReceiver(StoreBackend& store, const TokenDatabase& token_database,
                       KvReceiverOptions options)
    : store_(store),
      token_database_(token_database),
      options_{.tp_rank = std::max(options.tp_rank, 0), .transfer = options.transfer} {}

KvReceiver::~KvReceiver() { Stop(); }

void KvReceiver::Start() { worker_.Start(); }

void KvReceiver::Stop() { worker_.Stop(); }


void KvReceiver::Enqueue(ReqMeta request) { worker_.Push(std::move(request)); }

void KvReceiver::WaitIdle() { worker_.WaitIdle(); }

absl::flat_hash_set<std::string> KvReceiver::TakeFinished() {
  absl::MutexLock lock(&mu_);
  return std::exchange(finished_, {});
}

absl::flat_hash_set<int64_t> KvReceiver::TakeFailedBlockIds() {
  absl::MutexLock lock(&mu_);
  return std::exchange(failed_block_ids_, {});
}

KvReceiverStats KvReceiver::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

void KvReceiver::HandleRequest(const ReqMeta& request) {
  LoadSpec spec = request.load_spec.value_or(LoadSpec{});
  const uint32_t block_size = token_database_.block_size();
  uint64_t mask = block_size == 0 ? 0 : spec.vllm_cached_tokens / block_size * block_size;

  // Step L1: the chunks to load and where their bytes go.
  std::vector<TokenChunk> chunks =
      token_database_.ProcessTokens(spec.token_len, request.block_hashes, mask);
  std::vector<GetItem> items;
  std::vector<int64_t> item_blocks;
  std::vector<int64_t> failed_blocks;
  for (const TokenChunk& chunk : chunks) {
    absl::StatusOr<ChunkBuffers> buffers =
        token_database_.PrepareValue(chunk.start, chunk.end, request.block_ids);
    if (!buffers.ok()) {
      KVPOOL_LOG(ERROR) << "request " << request.req_id << ": cannot address chunk " << chunk.key
                        << ": " << buffers.status().message();
      continue;
    }
    GetItem item{.key = chunk.key, .parts = {}};
    for (size_t s = 0; s < buffers->addrs.size(); ++s) {
      item.parts.push_back(MutableBuffer{reinterpret_cast<void*>(buffers->addrs[s]),
                                         static_cast<size_t>(buffers->sizes[s])});
    }
    items.push_back(std::move(item));
    item_blocks.push_back(buffers->block_id);
  }

  // Step L2: rotated by rank, so that ranks do not all start on the same segment.
  if (!items.empty()) {
    size_t shift = static_cast<size_t>(options_.tp_rank) % items.size();
    std::rotate(items.begin(), items.begin() + static_cast<std::ptrdiff_t>(shift), items.end());
    std::rotate(item_blocks.begin(), item_blocks.begin() + static_cast<std::ptrdiff_t>(shift),
                item_blocks.end());
  }

  // Step L3: one batched multi-buffer get.
  uint64_t loaded = 0;
  uint64_t bytes = 0;
  if (!items.empty()) {
    std::vector<absl::StatusOr<uint64_t>> results;
    if (options_.transfer != nullptr) {
      std::vector<std::string> keys;
      std::vector<int32_t> ids;
      uint64_t block_bytes = 0;
      for (const KvSegment& segment : token_database_.segments()) block_bytes += segment.block_bytes;
      for (size_t i = 0; i < items.size(); ++i) {
        keys.push_back(items[i].key);
        ids.push_back(static_cast<int32_t>(item_blocks[i]));
      }
      for (absl::Status& status : options_.transfer->LoadBlocks(keys, ids)) {
        if (status.ok()) {
          results.push_back(block_bytes);
        } else {
          results.push_back(std::move(status));
        }
      }
    } else {
      results = store_.BatchGet(items);
    }
    std::vector<std::string> failures;
    for (size_t i = 0; i < items.size(); ++i) {
      absl::StatusOr<uint64_t> result =
          i < results.size() ? results[i] : absl::InternalError("no result");
      if (result.ok()) {
        ++loaded;
        bytes += *result;
      } else {
        failed_blocks.push_back(item_blocks[i]);
        if (failures.size() < 3) {
          failures.push_back(absl::StrCat(items[i].key, ": ", result.status().ToString()));
        }
      }
    }
    if (!failed_blocks.empty()) {
      KVPOOL_LOG(WARNING) << "request " << request.req_id << ": failed to get "
                          << failed_blocks.size() << " of " << items.size()
                          << " keys (first failures: " << absl::StrJoin(failures, "; ") << ")";
    }
  }

  absl::MutexLock lock(&mu_);
  ++stats_.requests;
  if (!items.empty()) ++stats_.batches;
  stats_.keys_loaded += loaded;
  stats_.bytes_loaded += bytes;
  stats_.keys_failed += failed_blocks.size();
  failed_block_ids_.insert(failed_blocks.begin(), failed_blocks.end());
  finished_.insert(request.req_id);
}

}  // namespace kvpool::engine
