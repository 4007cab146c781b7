#pragma once

// The per-request work a scheduler step hands to the engine plugin's worker, as in vLLM's
// MooncakeStoreConnector metadata: which tokens to store, which to load, into which blocks.
// Plain values; no behaviour.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "engine_plugin/ready_event.h"

namespace kvpool::engine {

// A load of tokens from the pool into the engine's blocks.
struct LoadSpec {
  // Tokens the engine already has in its own cache (not loaded again, rounded down to blocks).
  uint64_t vllm_cached_tokens = 0;
  // Tokens the pool has for this request (from Lookup).
  uint64_t kvpool_cached_tokens = 0;
  bool can_load = false;
  // Tokens to load up to; set by StoreWorker::GetFinished.
  uint64_t token_len = 0;
};

struct ReqMeta {
  std::string req_id;
  // Tokens of the request that have KV in the engine's blocks and may be stored.
  uint64_t token_len_chunk = 0;
  // The engine's block ids for the request, block index order.
  std::vector<int64_t> block_ids;
  // The engine's block hashes, as key text (hex for raw hash bytes; see HexHash).
  std::vector<std::string> block_hashes;
  bool can_save = false;
  std::optional<LoadSpec> load_spec;
  bool is_last_chunk = false;
  // Waited for before the request's blocks are read for a store; null: ready now.
  std::shared_ptr<ReadyEvent> ready_event;
};

// What one scheduler step asks of the worker.
struct StepMetadata {
  std::vector<ReqMeta> requests;
  // Requests preempted in this step: their pending store bookkeeping is dropped.
  absl::flat_hash_set<std::string> preempted_req_ids;
  // Recorded after the step's compute; given to every request stored in this step.
  std::shared_ptr<ReadyEvent> store_ready;
};

}  // namespace kvpool::engine
