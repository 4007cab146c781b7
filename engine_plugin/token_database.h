#pragma once

// Maps an engine request's tokens to pool keys and to the bytes of its KV blocks.
//
// A request's tokens fall into chunks of `block_size` tokens; chunk i is named by the
// engine's hash of block i (a chained hash, so equal prefixes give equal keys) and stored as
// one object whose value is the concatenation of that block's bytes in every segment of the
// KV cache layout. Keys look like
//   "<model>@tp_rank:<N>@pcp<N>@dcp<N>@pp_rank:<N>@<hash>"
// exactly as vLLM's MooncakeStoreConnector forms them, so pools are shared with it.
//
// A TokenDatabase is an immutable value after construction (SetLayout included); share it
// between threads freely once set up.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "engine_plugin/kv_cache_layout.h"

namespace kvpool::engine {

// The parts of a key that say whose KV this is.
struct KeyMetadata {
  std::string model_name;
  int tp_rank = 0;
  int pcp_rank = 0;
  int dcp_rank = 0;
  int pp_rank = 0;
};

// "<model>@tp_rank:<tp>@pcp<pcp>@dcp<dcp>@pp_rank:<pp>@<chunk_hash>".
std::string PoolKey(const KeyMetadata& metadata, absl::string_view chunk_hash);

// Lower-case hex of raw hash bytes (vLLM's BlockHash.hex()).
std::string HexHash(absl::string_view bytes);

// The last path component of a model name or path, as keys use it ("org/Llama-3/" ->
// "Llama-3").
std::string ModelKeyName(absl::string_view model);

// Tokens [start, end) of a request, stored under `key`; `index` is the block index.
struct TokenChunk {
  uint64_t start = 0;
  uint64_t end = 0;
  std::string key;
  size_t index = 0;
};

// The buffers holding one chunk: one address and size per segment, in segment order.
struct ChunkBuffers {
  std::vector<uint64_t> addrs;
  std::vector<uint64_t> sizes;
  int64_t block_id = 0;
  uint64_t total_bytes() const;
};

// How much of a request to store at this step (the scheduler side of a save).
struct SavePlan {
  bool save = false;
  // Tokens covered by the store: whole blocks only when partial chunks are discarded.
  uint64_t tokens_to_save = 0;
};

class TokenDatabase {
 public:
  TokenDatabase(KeyMetadata metadata, uint32_t block_size);

  // Sets the segments PrepareValue addresses. InvalidArgument if a segment's block length is
  // not a multiple of block_size, or the layout's block size differs.
  absl::Status SetLayout(const KvCacheLayout& layout);

  const KeyMetadata& metadata() const { return metadata_; }
  uint32_t block_size() const { return block_size_; }
  bool has_layout() const { return !segments_.empty(); }
  const std::vector<KvSegment>& segments() const { return segments_; }

  std::string KeyFor(absl::string_view chunk_hash) const { return PoolKey(metadata_, chunk_hash); }

  // The chunks of the first `token_len` tokens: chunk i covers [i*block_size,
  // min((i+1)*block_size, token_len)) and is keyed by block_hashes[i]; chunks past the hashes
  // are not produced (a partial last block has a hash only if the engine gave one). Chunks
  // that start before `mask_num` (tokens already cached in the engine) are skipped.
  std::vector<TokenChunk> ProcessTokens(uint64_t token_len,
                                        absl::Span<const std::string> block_hashes,
                                        uint64_t mask_num = 0) const;

  // The bytes of tokens [start, end) of the block that holds token `start`
  // (block_ids[start / block_size]): per segment, base + block_id * block_bytes, and
  // block_bytes / block_size * (end - start) bytes. FailedPrecondition before SetLayout;
  // InvalidArgument if the range is empty, spans two blocks, or the block index or block id
  // is out of range.
  absl::StatusOr<ChunkBuffers> PrepareValue(uint64_t start, uint64_t end,
                                            absl::Span<const int64_t> block_ids) const;
  // The block id alone, with PrepareValue's checks (for a block transfer, which moves whole
  // blocks by id and needs no per-segment buffers).
  absl::StatusOr<int64_t> BlockOf(uint64_t start, uint64_t end,
                                  absl::Span<const int64_t> block_ids) const;
  // The bytes PrepareValue's buffers for tokens [start, end) of one block add up to.
  uint64_t ChunkBytes(uint64_t start, uint64_t end) const;

  // Which tokens of a request to store now, given `num_saved_tokens` already stored: with
  // `discard_partial_chunks`, whole blocks only, and nothing unless at least one new whole
  // block is complete; otherwise every token. `save` is false when there is nothing new.
  static SavePlan PlanSave(uint64_t token_len, uint64_t num_saved_tokens, uint32_t block_size,
                           bool discard_partial_chunks);

 private:
  KeyMetadata metadata_;
  uint32_t block_size_;
  uint64_t num_blocks_ = 0;
  std::vector<KvSegment> segments_;
};

}  // namespace kvpool::engine
