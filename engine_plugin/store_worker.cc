#include "engine_plugin/store_worker.h"

#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "common/log.h"

namespace kvpool::engine {

absl::StatusOr<KvRole> ParseKvRole(absl::string_view role) {
  if (role == "kv_producer") return KvRole::kProducer;
  if (role == "kv_consumer") return KvRole::kConsumer;
  if (role == "kv_both") return KvRole::kBoth;
  return absl::InvalidArgumentError(
      absl::StrCat("kv_role \"", role, "\" is not kv_producer, kv_consumer or kv_both"));
}

namespace {

absl::Status CheckRank(absl::string_view what, int rank, int size) {
  if (size < 1) return absl::InvalidArgumentError(absl::StrCat(what, "_size ", size, " is below 1"));
  if (rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, "_rank ", rank, " is outside [0, ", size, ")"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<StoreWorker>> StoreWorker::Create(StoreBackend& store,
                                                                  StoreWorkerOptions options) {
  for (auto [what, rank, size] : {std::tuple{"tp", options.tp_rank, options.tp_size},
                                  std::tuple{"pp", options.pp_rank, options.pp_size},
                                  std::tuple{"pcp", options.pcp_rank, options.pcp_size},
                                  std::tuple{"dcp", options.dcp_rank, options.dcp_size}}) {
    if (absl::Status s = CheckRank(what, rank, size); !s.ok()) return s;
  }
  if (options.block_size == 0) return absl::InvalidArgumentError("block_size is 0");
  std::string model = ModelKeyName(options.model_name);
  if (model.empty()) return absl::InvalidArgumentError("model name is empty");
  if (options.use_mla) options.num_kv_heads = 1;
  if (options.num_kv_heads < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_kv_heads ", options.num_kv_heads, " is below 1"));
  }

  // Chunks span the tokens of every context-parallel rank's share of a block.
  uint32_t block_size = options.block_size;
  if (options.pcp_size > 1) block_size *= static_cast<uint32_t>(options.pcp_size);
  if (options.dcp_size > 1) block_size *= static_cast<uint32_t>(options.dcp_size);

  // Fewer KV heads than TP ranks: ranks with the same heads share keys and split the stores.
  int put_step = 1;
  int head_or_tp_rank = options.tp_rank;
  if (options.num_kv_heads < options.tp_size) {
    put_step = options.tp_size / options.num_kv_heads;
    head_or_tp_rank = options.tp_rank / put_step;
  }
  KeyMetadata metadata{.model_name = model,
                       .tp_rank = head_or_tp_rank,
                       .pcp_rank = options.pcp_size > 1 ? options.pcp_rank : 0,
                       .dcp_rank = options.dcp_size > 1 ? options.dcp_rank : 0,
                       .pp_rank = options.pp_rank};
  return std::unique_ptr<StoreWorker>(
      new StoreWorker(store, std::move(options), put_step, std::move(metadata), block_size));
}

StoreWorker::StoreWorker(StoreBackend& store, StoreWorkerOptions options, int put_step,
                         KeyMetadata metadata, uint32_t block_size)
    : store_(store),
      options_(std::move(options)),
      put_step_(put_step),
      token_database_(std::move(metadata), block_size) {}

StoreWorker::~StoreWorker() { Stop(); }

absl::Status StoreWorker::RegisterKvCaches(absl::Span<const TensorDesc> tensors,
                                           uint64_t num_blocks) {
  if (layout_.has_value()) return absl::FailedPreconditionError("KV caches are already registered");
  absl::StatusOr<KvCacheLayout> layout =
      KvCacheLayout::Detect(tensors, num_blocks, token_database_.block_size());
  if (!layout.ok()) return layout.status();
  for (const MemoryRegion& region : layout->regions()) {
    if (absl::Status s = store_.RegisterBuffer(region.base, region.bytes); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("registering KV cache storage at 0x",
                                                 absl::Hex(region.base), " (", region.bytes,
                                                 " bytes): ", s.message()));
    }
  }
  return RegisterLayout(*layout);
}

absl::Status StoreWorker::RegisterCrossLayerKvCache(const TensorDesc& tensor,
                                                    uint64_t num_blocks) {
  return RegisterKvCaches(absl::MakeConstSpan(&tensor, 1), num_blocks);
}

absl::Status StoreWorker::RegisterDeviceKvCaches(absl::Span<const TensorDesc> tensors,
                                                 uint64_t num_blocks,
                                                 const TransferFactory& make_transfer) {
  if (layout_.has_value()) return absl::FailedPreconditionError("KV caches are already registered");
  absl::StatusOr<KvCacheLayout> layout =
      KvCacheLayout::Detect(tensors, num_blocks, token_database_.block_size());
  if (!layout.ok()) return layout.status();
  absl::StatusOr<std::unique_ptr<BlockTransfer>> transfer = make_transfer(*layout);
  if (!transfer.ok()) return transfer.status();
  if (*transfer == nullptr) return absl::InvalidArgumentError("the transfer factory gave nothing");
  return RegisterLayout(*layout, *std::move(transfer));
}

absl::Status StoreWorker::RegisterLayout(const KvCacheLayout& layout,
                                         std::unique_ptr<BlockTransfer> transfer) {
  if (layout_.has_value()) return absl::FailedPreconditionError("KV caches are already registered");
  if (absl::Status s = token_database_.SetLayout(layout); !s.ok()) return s;
  layout_ = layout;
  transfer_ = std::move(transfer);
  KVPOOL_LOG(INFO) << "registered KV caches: " << layout.DebugString() << "; keys "
                   << token_database_.KeyFor("<hash>") << ", put_step " << put_step_
                   << (transfer_ != nullptr ? ", device cache (block transfer)" : "");
  if (stores()) {
    sender_ = std::make_unique<KvSender>(
        store_, token_database_,
        KvSenderOptions{
            .tp_rank = options_.tp_rank, .put_step = put_step_, .transfer = transfer_.get()});
    sender_->Start();
  }
  receiver_ = std::make_unique<KvReceiver>(store_, token_database_,
                                           KvReceiverOptions{.tp_rank = options_.tp_rank,
                                                             .transfer = transfer_.get()});
  receiver_->Start();
  return absl::OkStatus();
}

// Loads: up to the pool's hit, plus the last token when the hit stops one short of a partial
// block (the engine recomputes at least one token itself).
std::optional<ReqMeta> StoreWorker::LoadOf(const ReqMeta& request, uint64_t block_size) {
  if (!request.load_spec.has_value() || !request.load_spec->can_load) return std::nullopt;
  ReqMeta load = request;
  LoadSpec& spec = *load.load_spec;
  uint64_t token_len = request.token_len_chunk;
  if (spec.kvpool_cached_tokens % block_size != 0 && spec.kvpool_cached_tokens + 1 == token_len) {
    spec.token_len = spec.kvpool_cached_tokens + 1;
  } else {
    spec.token_len = spec.kvpool_cached_tokens;
  }
  return load;
}

absl::Status StoreWorker::StartLoadKv(const StepMetadata& meta) {
  if (receiver_ == nullptr) return absl::FailedPreconditionError("no KV cache is registered");
  std::vector<ReqMeta> loads;
  for (const ReqMeta& request : meta.requests) {
    if (layerwise_started_.contains(request.req_id)) continue;
    if (std::optional<ReqMeta> load = LoadOf(request, token_database_.block_size())) {
      layerwise_started_.insert(request.req_id);
      loads.push_back(*std::move(load));
    }
  }
  if (!loads.empty()) receiver_->StartLayerwise(loads);
  return absl::OkStatus();
}

absl::Status StoreWorker::WaitForLayerLoad(int layer, uintptr_t stream) {
  if (receiver_ == nullptr) return absl::FailedPreconditionError("no KV cache is registered");
  return receiver_->WaitForLayer(layer, stream);
}

absl::StatusOr<StoreWorker::Finished> StoreWorker::GetFinished(
    const absl::flat_hash_set<std::string>& finished_req_ids, StepMetadata meta) {
  if (receiver_ == nullptr) return absl::FailedPreconditionError("no KV cache is registered");
  const uint64_t block_size = token_database_.block_size();

  // Loads started layer by layer (StartLoadKv) are done by now (the step ran): reported here.
  receiver_->FinishLayerwise();
  for (const ReqMeta& request : meta.requests) {
    if (layerwise_started_.contains(request.req_id)) continue;
    if (std::optional<ReqMeta> load = LoadOf(request, block_size)) {
      receiver_->Enqueue(*std::move(load));
    }
  }
  layerwise_started_.clear();

  // Stores: every saving request waits for the step's ready event unless it has its own.
  if (stores()) {
    for (ReqMeta& request : meta.requests) {
      if (!request.can_save) continue;
      if (request.ready_event == nullptr) request.ready_event = meta.store_ready;
      sender_->AddStoredRequest(request.req_id);
      sender_->Enqueue(request);
    }
  }

  Finished finished;
  if (stores()) finished.sending = FinishedSending(finished_req_ids, meta);
  finished.recving = receiver_->TakeFinished();
  return finished;
}

absl::flat_hash_set<std::string> StoreWorker::FinishedSending(
    const absl::flat_hash_set<std::string>& finished_req_ids, const StepMetadata& meta) {
  absl::flat_hash_set<std::string> done;
  for (const std::string& req_id : meta.preempted_req_ids) {
    sender_->DeleteFinishedStoredRequest(req_id);
  }
  // Requests that finished earlier with stores pending, whose stores are now done.
  for (const auto& [req_id, pending] : sender_->StoredRequests()) {
    if (pending == 0 && finished_store_req_.contains(req_id)) {
      finished_store_req_.erase(req_id);
      done.insert(req_id);
      sender_->DeleteFinishedStoredRequest(req_id);
    }
  }
  // Requests finishing now: done at once if nothing is pending, else remembered.
  for (const std::string& req_id : finished_req_ids) {
    std::optional<int> pending = sender_->PendingJobs(req_id);
    if (!pending.has_value()) continue;
    if (*pending == 0) {
      done.insert(req_id);
      sender_->DeleteFinishedStoredRequest(req_id);
    } else {
      finished_store_req_.insert(req_id);
    }
  }
  return done;
}

uint64_t StoreWorker::Lookup(uint64_t token_len, absl::Span<const std::string> block_hashes) const {
  std::vector<TokenChunk> chunks = token_database_.ProcessTokens(token_len, block_hashes);
  if (chunks.empty()) return 0;
  // Every rank's key of every chunk: row (tp, pp) holds chunks.size() keys.
  const int tp_ranks = std::min(options_.tp_size, options_.num_kv_heads);
  std::vector<std::string> keys;
  keys.reserve(chunks.size() * tp_ranks * options_.pp_size);
  KeyMetadata rank_metadata = token_database_.metadata();
  for (int pp = 0; pp < options_.pp_size; ++pp) {
    for (int tp = 0; tp < tp_ranks; ++tp) {
      rank_metadata.tp_rank = tp;
      rank_metadata.pp_rank = pp;
      for (const TokenChunk& chunk : chunks) {
        keys.push_back(PoolKey(rank_metadata, block_hashes[chunk.index]));
      }
    }
  }
  // This rank's own keys through the block transfer, which keeps their leased locations for
  // the load that usually follows (one master round trip fewer before its first copy).
  // Their row: keys [own, own + chunks.size()) when the transfer answered, else none.
  const KeyMetadata& rank = token_database_.metadata();
  size_t own = keys.size();
  std::optional<std::vector<bool>> located;
  if (transfer_ != nullptr && rank.tp_rank < tp_ranks && rank.pp_rank < options_.pp_size) {
    const size_t row =
        static_cast<size_t>(rank.pp_rank * tp_ranks + rank.tp_rank) * chunks.size();
    located = transfer_->Locate(absl::MakeConstSpan(keys).subspan(row, chunks.size()));
    if (located.has_value()) own = row;
  }
  auto is_own = [&](size_t k) { return k >= own && k < own + chunks.size(); };
  std::vector<std::string> others;
  for (size_t k = 0; k < keys.size(); ++k) {
    if (!is_own(k)) others.push_back(keys[k]);
  }
  std::vector<absl::StatusOr<bool>> exists =
      others.empty() ? std::vector<absl::StatusOr<bool>>() : store_.BatchExist(others);
  size_t first_missing = chunks.size();
  for (size_t k = 0, e = 0; k < keys.size(); ++k) {
    const bool present = is_own(k) ? (*located)[k - own]
                                   : (e < exists.size() && exists[e].ok() && *exists[e]);
    if (!is_own(k)) ++e;
    if (!present) first_missing = std::min(first_missing, k % chunks.size());
  }
  if (first_missing < chunks.size()) return chunks[first_missing].start;
  return chunks.back().end;
}

absl::flat_hash_set<int64_t> StoreWorker::TakeFailedLoadBlockIds() {
  return receiver_ == nullptr ? absl::flat_hash_set<int64_t>{} : receiver_->TakeFailedBlockIds();
}

void StoreWorker::WaitIdle() {
  if (sender_ != nullptr) sender_->WaitIdle();
  if (receiver_ != nullptr) receiver_->WaitIdle();
}

void StoreWorker::Stop() {
  if (sender_ != nullptr) sender_->Stop();
  if (receiver_ != nullptr) receiver_->Stop();
}

}  // namespace kvpool::engine
