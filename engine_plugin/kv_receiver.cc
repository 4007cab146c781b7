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

KvReceiver::PlannedLoad KvReceiver::Plan(const ReqMeta& request) const {
  LoadSpec spec = request.load_spec.value_or(LoadSpec{});
  const uint32_t block_size = token_database_.block_size();
  uint64_t mask = block_size == 0 ? 0 : spec.vllm_cached_tokens / block_size * block_size;

  // Step L1: the chunks to load and where their bytes go.
  PlannedLoad plan;
  std::vector<TokenChunk> chunks =
      token_database_.ProcessTokens(spec.token_len, request.block_hashes, mask);
  plan.items.reserve(chunks.size());
  plan.blocks.reserve(chunks.size());
  for (TokenChunk& chunk : chunks) {
    if (options_.transfer != nullptr) {
      // The transfer moves whole blocks by id: no per-segment buffers to address.
      absl::StatusOr<int64_t> block =
          token_database_.BlockOf(chunk.start, chunk.end, request.block_ids);
      if (!block.ok()) {
        KVPOOL_LOG(ERROR) << "request " << request.req_id << ": cannot address chunk "
                          << chunk.key << ": " << block.status().message();
        continue;
      }
      plan.items.push_back(GetItem{.key = std::move(chunk.key), .parts = {}});
      plan.blocks.push_back(*block);
      continue;
    }
    absl::StatusOr<ChunkBuffers> buffers =
        token_database_.PrepareValue(chunk.start, chunk.end, request.block_ids);
    if (!buffers.ok()) {
      KVPOOL_LOG(ERROR) << "request " << request.req_id << ": cannot address chunk " << chunk.key
                        << ": " << buffers.status().message();
      continue;
    }
    GetItem item{.key = std::move(chunk.key), .parts = {}};
    item.parts.reserve(buffers->addrs.size());
    for (size_t s = 0; s < buffers->addrs.size(); ++s) {
      item.parts.push_back(MutableBuffer{reinterpret_cast<void*>(buffers->addrs[s]),
                                         static_cast<size_t>(buffers->sizes[s])});
    }
    plan.items.push_back(std::move(item));
    plan.blocks.push_back(buffers->block_id);
  }

  // Step L2: rotated by rank, so that ranks do not all start on the same segment.
  if (!plan.items.empty()) {
    size_t shift = static_cast<size_t>(options_.tp_rank) % plan.items.size();
    std::rotate(plan.items.begin(), plan.items.begin() + static_cast<std::ptrdiff_t>(shift),
                plan.items.end());
    std::rotate(plan.blocks.begin(), plan.blocks.begin() + static_cast<std::ptrdiff_t>(shift),
                plan.blocks.end());
  }
  return plan;
}

void KvReceiver::TransferArgs(const PlannedLoad& plan, std::vector<std::string>& keys,
                              std::vector<int32_t>& ids) {
  for (size_t i = 0; i < plan.items.size(); ++i) {
    keys.push_back(plan.items[i].key);
    ids.push_back(static_cast<int32_t>(plan.blocks[i]));
  }
}

std::vector<absl::StatusOr<uint64_t>> KvReceiver::ToResults(std::vector<absl::Status> statuses) {
  uint64_t block_bytes = 0;
  for (const KvSegment& segment : token_database_.segments()) block_bytes += segment.block_bytes;
  std::vector<absl::StatusOr<uint64_t>> results;
  for (absl::Status& status : statuses) {
    if (status.ok()) {
      results.push_back(block_bytes);
    } else {
      results.push_back(std::move(status));
    }
  }
  return results;
}

void KvReceiver::HandleRequest(const ReqMeta& request) {
  PlannedLoad plan = Plan(request);
  // Step L3: one batched multi-buffer get.
  std::vector<absl::StatusOr<uint64_t>> results;
  if (!plan.items.empty()) {
    if (options_.transfer != nullptr) {
      std::vector<std::string> keys;
      std::vector<int32_t> ids;
      TransferArgs(plan, keys, ids);
      results = ToResults(options_.transfer->LoadBlocks(keys, ids));
    } else {
      results = store_.BatchGet(plan.items);
    }
  }
  Record(request.req_id, plan, results);
}

void KvReceiver::Record(const std::string& req_id, const PlannedLoad& plan,
                        const std::vector<absl::StatusOr<uint64_t>>& results) {
  uint64_t loaded = 0;
  uint64_t bytes = 0;
  std::vector<int64_t> failed_blocks;
  std::vector<std::string> failures;
  for (size_t i = 0; i < plan.items.size(); ++i) {
    absl::StatusOr<uint64_t> result =
        i < results.size() ? results[i] : absl::InternalError("no result");
    if (result.ok()) {
      ++loaded;
      bytes += *result;
    } else {
      failed_blocks.push_back(plan.blocks[i]);
      if (failures.size() < 3) {
        failures.push_back(absl::StrCat(plan.items[i].key, ": ", result.status().ToString()));
      }
    }
  }
  if (!failed_blocks.empty()) {
    KVPOOL_LOG(WARNING) << "request " << req_id << ": failed to get " << failed_blocks.size()
                        << " of " << plan.items.size()
                        << " keys (first failures: " << absl::StrJoin(failures, "; ") << ")";
  }

  absl::MutexLock lock(&mu_);
  ++stats_.requests;
  if (!plan.items.empty()) ++stats_.batches;
  stats_.keys_loaded += loaded;
  stats_.bytes_loaded += bytes;
  stats_.keys_failed += failed_blocks.size();
  failed_block_ids_.insert(failed_blocks.begin(), failed_blocks.end());
  finished_.insert(req_id);
}

void KvReceiver::StartLayerwise(absl::Span<const ReqMeta> requests) {
  Layerwise started;
  std::vector<std::string> keys;
  std::vector<int32_t> ids;
  for (const ReqMeta& request : requests) {
    started.requests.emplace_back(request.req_id, Plan(request));
    TransferArgs(started.requests.back().second, keys, ids);
  }
  // One load for every request of the step: its layers land together.
  if (options_.transfer != nullptr) {
    started.load = options_.transfer->StartLayerwiseLoad(keys, ids);
  } else {
    std::vector<GetItem> items;
    for (const auto& [req_id, plan] : started.requests) {
      items.insert(items.end(), plan.items.begin(), plan.items.end());
    }
    std::vector<absl::Status> statuses;
    for (absl::StatusOr<uint64_t>& r : store_.BatchGet(items)) statuses.push_back(r.status());
    started.load = std::make_unique<FinishedLoad>(std::move(statuses));
  }
  absl::MutexLock lock(&layerwise_mu_);
  layerwise_.push_back(std::move(started));
}

absl::Status KvReceiver::WaitForLayer(int layer, uintptr_t stream) {
  if (options_.transfer != nullptr) return options_.transfer->WaitForLayer(layer, stream);
  return layer < 0 ? absl::InvalidArgumentError("negative layer") : absl::OkStatus();
}

void KvReceiver::FinishLayerwise() {
  std::vector<Layerwise> started;
  {
    absl::MutexLock lock(&layerwise_mu_);
    started = std::exchange(layerwise_, {});
  }
  for (Layerwise& load : started) {
    std::vector<absl::StatusOr<uint64_t>> results = ToResults(load.load->Finish());
    size_t next = 0;
    for (const auto& [req_id, plan] : load.requests) {
      std::vector<absl::StatusOr<uint64_t>> own;
      for (size_t i = 0; i < plan.items.size(); ++i, ++next) {
        own.push_back(next < results.size() ? results[next] : absl::InternalError("no result"));
      }
      Record(req_id, plan, own);
    }
  }
}

}  // namespace kvpool::engine
