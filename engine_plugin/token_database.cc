#include "engine_plugin/token_database.h"

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace kvpool::engine {

std::string PoolKey(const KeyMetadata& m, absl::string_view chunk_hash) {
  return absl::StrCat(m.model_name, "@tp_rank:", m.tp_rank, "@pcp", m.pcp_rank, "@dcp",
                      m.dcp_rank, "@pp_rank:", m.pp_rank, "@", chunk_hash);
}

std::string HexHash(absl::string_view bytes) { return absl::BytesToHexString(bytes); }

std::string ModelKeyName(absl::string_view model) {
  while (absl::ConsumeSuffix(&model, "/")) {
  }
  size_t slash = model.rfind('/');
  return std::string(slash == absl::string_view::npos ? model : model.substr(slash + 1));
}

uint64_t ChunkBuffers::total_bytes() const {
  uint64_t total = 0;
  for (uint64_t size : sizes) total += size;
  return total;
}

TokenDatabase::TokenDatabase(KeyMetadata metadata, uint32_t block_size)
    : metadata_(std::move(metadata)), block_size_(block_size) {}

absl::Status TokenDatabase::SetLayout(const KvCacheLayout& layout) {
  if (block_size_ == 0) return absl::InvalidArgumentError("block size is 0");
  if (layout.block_size_tokens() != block_size_) {
    return absl::InvalidArgumentError(absl::StrCat("layout was detected for blocks of ",
                                                   layout.block_size_tokens(),
                                                   " tokens, the token database uses ",
                                                   block_size_));
  }
  for (const KvSegment& segment : layout.segments()) {
    if (segment.block_bytes == 0 || segment.block_bytes % block_size_ != 0) {
      return absl::InvalidArgumentError(absl::StrCat("block length ", segment.block_bytes,
                                                     " is not a multiple of the block size ",
                                                     block_size_));
    }
  }
  segments_ = layout.segments();
  num_blocks_ = layout.num_blocks();
  return absl::OkStatus();
}

std::vector<TokenChunk> TokenDatabase::ProcessTokens(uint64_t token_len,
                                                     absl::Span<const std::string> block_hashes,
                                                     uint64_t mask_num) const {
  std::vector<TokenChunk> chunks;
  if (block_size_ == 0) return chunks;
  for (size_t i = 0; i < block_hashes.size(); ++i) {
    uint64_t start = static_cast<uint64_t>(i) * block_size_;
    if (start >= token_len) break;
    if (start < mask_num) continue;
    chunks.push_back(TokenChunk{.start = start,
                                .end = std::min<uint64_t>(start + block_size_, token_len),
                                .key = KeyFor(block_hashes[i]),
                                .index = i});
  }
  return chunks;
}

absl::StatusOr<ChunkBuffers> TokenDatabase::PrepareValue(uint64_t start, uint64_t end,
                                                         absl::Span<const int64_t> block_ids) const {
  absl::StatusOr<int64_t> block_id = BlockOf(start, end, block_ids);
  if (!block_id.ok()) return block_id.status();
  ChunkBuffers buffers;
  buffers.block_id = *block_id;
  buffers.addrs.reserve(segments_.size());
  buffers.sizes.reserve(segments_.size());
  for (const KvSegment& segment : segments_) {
    buffers.addrs.push_back(segment.base + static_cast<uint64_t>(*block_id) * segment.block_bytes);
    buffers.sizes.push_back(segment.block_bytes / block_size_ * (end - start));
  }
  return buffers;
}

uint64_t TokenDatabase::ChunkBytes(uint64_t start, uint64_t end) const {
  uint64_t bytes = 0;
  for (const KvSegment& segment : segments_) {
    bytes += segment.block_bytes / block_size_ * (end - start);
  }
  return bytes;
}

absl::StatusOr<int64_t> TokenDatabase::BlockOf(uint64_t start, uint64_t end,
                                               absl::Span<const int64_t> block_ids) const {
  if (segments_.empty()) {
    return absl::FailedPreconditionError("no KV cache is registered");
  }
  if (end <= start || end - start > block_size_ || (end - 1) / block_size_ != start / block_size_) {
    return absl::InvalidArgumentError(
        absl::StrCat("token range [", start, ", ", end, ") is not within one block of ",
                     block_size_, " tokens"));
  }
  uint64_t block_index = start / block_size_;
  if (block_index >= block_ids.size()) {
    return absl::InvalidArgumentError(absl::StrCat("token ", start, " is in block ", block_index,
                                                   " but the request has ", block_ids.size(),
                                                   " block ids"));
  }
  int64_t block_id = block_ids[block_index];
  if (block_id < 0 || static_cast<uint64_t>(block_id) >= num_blocks_) {
    return absl::InvalidArgumentError(absl::StrCat("block id ", block_id, " is outside the ",
                                                   num_blocks_, " registered blocks"));
  }
  return block_id;
}

SavePlan TokenDatabase::PlanSave(uint64_t token_len, uint64_t num_saved_tokens,
                                 uint32_t block_size, bool discard_partial_chunks) {
  if (block_size == 0) return SavePlan{};
  // With whole blocks only, the next store needs the block after the saved ones complete.
  uint64_t chunk_boundary =
      discard_partial_chunks ? (num_saved_tokens + 1 + block_size - 1) / block_size * block_size
                             : 0;
  uint64_t tokens = discard_partial_chunks ? token_len / block_size * block_size : token_len;
  return SavePlan{.save = tokens >= chunk_boundary, .tokens_to_save = tokens};
}

}  // namespace kvpool::engine
