#pragma once

// Scheduler work for tests of the engine plugin's worker.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "engine_plugin/request.h"

namespace kvpool::engine::testing {

// A request whose blocks may be stored: block i (`block_size` tokens) lives in engine block
// `block_ids[i]` and is named by `hashes[i]`.
inline ReqMeta SaveRequest(const std::string& id, std::vector<std::string> hashes,
                           std::vector<int64_t> block_ids, uint32_t block_size) {
  ReqMeta r;
  r.req_id = id;
  r.token_len_chunk = hashes.size() * block_size;
  r.block_hashes = std::move(hashes);
  r.block_ids = std::move(block_ids);
  r.can_save = true;
  return r;
}

}  // namespace kvpool::engine::testing
