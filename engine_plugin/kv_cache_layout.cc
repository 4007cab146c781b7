#include "engine_plugin/kv_cache_layout.h"

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace kvpool::engine {
namespace {

std::string Hex(uint64_t value) { return absl::StrCat("0x", absl::Hex(value)); }

std::string ShapeString(const std::vector<int64_t>& dims) {
  return absl::StrCat("(", absl::StrJoin(dims, ", "), ")");
}

absl::Status Refuse(absl::string_view tensor, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("KV cache tensor ", tensor, ": ", why));
}

absl::Status CheckBlockSize(absl::string_view what, uint64_t block_bytes,
                            uint32_t block_size_tokens) {
  if (block_size_tokens == 0) return absl::InvalidArgumentError("block size in tokens is 0");
  if (block_bytes == 0) return absl::InvalidArgumentError(absl::StrCat(what, ": block of 0 bytes"));
  if (block_bytes % block_size_tokens != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": block length ", block_bytes, " bytes is not a multiple of the block ",
                     "size of ", block_size_tokens, " tokens"));
  }
  return absl::OkStatus();
}

// The segments of one tensor, or why its layout is refused.
absl::StatusOr<std::vector<KvSegment>> SegmentsOf(const TensorDesc& t, absl::string_view name,
                                                  uint64_t num_blocks) {
  const size_t rank = t.shape.size();
  if (rank == 0) return Refuse(name, "has no dimensions");
  if (t.strides.size() != rank) {
    return Refuse(name, absl::StrCat("shape ", ShapeString(t.shape), " has ", rank,
                                     " dimensions but strides ", ShapeString(t.strides), " have ",
                                     t.strides.size()));
  }
  if (t.element_size == 0) return Refuse(name, "element size is 0");
  for (size_t d = 0; d < rank; ++d) {
    if (t.shape[d] <= 0) return Refuse(name, absl::StrCat("dimension ", d, " is empty"));
    if (t.strides[d] < 0) {
      return Refuse(name, absl::StrCat("dimension ", d, " has a negative stride"));
    }
  }
  if (t.storage_bytes == 0) return Refuse(name, "storage is empty");
  if (t.data_ptr < t.storage_ptr || t.data_ptr - t.storage_ptr >= t.storage_bytes) {
    return Refuse(name, absl::StrCat("data pointer ", Hex(t.data_ptr), " lies outside its storage [",
                                     Hex(t.storage_ptr), ", +", t.storage_bytes, ")"));
  }
  if (t.storage_bytes % num_blocks != 0) {
    return Refuse(name, absl::StrCat("storage of ", t.storage_bytes,
                                     " bytes does not divide into ", num_blocks, " blocks"));
  }
  const uint64_t page = t.storage_bytes / num_blocks;

  // Byte strides, computed wide so that absurd strides cannot wrap around.
  std::vector<unsigned __int128> byte_stride(rank);
  std::vector<size_t> outer;
  for (size_t d = 0; d < rank; ++d) {
    byte_stride[d] = static_cast<unsigned __int128>(t.strides[d]) * t.element_size;
    if (t.shape[d] > 1 && byte_stride[d] > page) outer.push_back(d);
  }
  if (outer.size() > 1) {
    return Refuse(name, absl::StrCat("dimensions ", absl::StrJoin(outer, " and "),
                                     " both stride past a page of ", page,
                                     " bytes; only one outer (K/V) dimension is supported"));
  }

  uint64_t block_bytes = page;
  uint64_t segment_stride = 0;
  int64_t segment_count = 1;
  if (!outer.empty()) {
    const size_t d = outer[0];
    if (byte_stride[d] > t.storage_bytes) {
      return Refuse(name, absl::StrCat("dimension ", d, " strides past the whole storage of ",
                                       t.storage_bytes, " bytes"));
    }
    segment_stride = static_cast<uint64_t>(byte_stride[d]);
    if (segment_stride % num_blocks != 0) {
      return Refuse(name, absl::StrCat("outer dimension ", d, " strides ", segment_stride,
                                       " bytes, which does not divide into ", num_blocks,
                                       " blocks"));
    }
    block_bytes = segment_stride / num_blocks;
    segment_count = t.shape[d];
  }

  // Block b must start exactly b * block_bytes after the base: some dimension of size
  // num_blocks has to step by one block.
  if (num_blocks > 1) {
    bool found = false;
    for (size_t d = 0; d < rank && !found; ++d) {
      if (!outer.empty() && d == outer[0]) continue;
      found = static_cast<uint64_t>(t.shape[d]) == num_blocks && byte_stride[d] == block_bytes;
    }
    if (!found) {
      return Refuse(name, absl::StrCat("no dimension of size ", num_blocks, " steps by one block of ",
                                       block_bytes, " bytes (shape ", ShapeString(t.shape),
                                       ", strides ", ShapeString(t.strides),
                                       "); blocks are not laid out as the page size implies"));
    }
  }

  std::vector<KvSegment> segments;
  const uint64_t storage_end = t.storage_ptr + t.storage_bytes;
  for (int64_t i = 0; i < segment_count; ++i) {
    KvSegment segment{.base = t.data_ptr + static_cast<uint64_t>(i) * segment_stride,
                      .block_bytes = block_bytes};
    if (segment.base > storage_end || num_blocks * block_bytes > storage_end - segment.base) {
      return Refuse(name, absl::StrCat("segment ", i, " at ", Hex(segment.base), " (", num_blocks,
                                       " blocks of ", block_bytes,
                                       " bytes) extends past the end of its storage at ",
                                       Hex(storage_end)));
    }
    segments.push_back(segment);
  }
  return segments;
}

}  // namespace

absl::StatusOr<KvCacheLayout> KvCacheLayout::Detect(absl::Span<const TensorDesc> tensors,
                                                    uint64_t num_blocks,
                                                    uint32_t block_size_tokens) {
  if (tensors.empty()) return absl::InvalidArgumentError("no KV cache tensors to register");
  if (num_blocks == 0) return absl::InvalidArgumentError("number of blocks is 0");
  if (block_size_tokens == 0) return absl::InvalidArgumentError("block size in tokens is 0");

  KvCacheLayout layout;
  layout.num_blocks_ = num_blocks;
  layout.block_size_tokens_ = block_size_tokens;
  absl::flat_hash_map<uint64_t, uint64_t> region_bytes;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorDesc& t = tensors[i];
    std::string name = t.name.empty() ? absl::StrCat("#", i) : absl::StrCat("\"", t.name, "\"");
    absl::StatusOr<std::vector<KvSegment>> segments = SegmentsOf(t, name, num_blocks);
    if (!segments.ok()) return segments.status();
    for (const KvSegment& segment : *segments) {
      if (absl::Status s = CheckBlockSize(absl::StrCat("KV cache tensor ", name), segment.block_bytes,
                                          block_size_tokens);
          !s.ok()) {
        return s;
      }
      layout.segments_.push_back(segment);
      layout.segment_tensors_.push_back(static_cast<int>(i));
    }
    auto [it, inserted] = region_bytes.try_emplace(t.storage_ptr, t.storage_bytes);
    if (inserted) {
      layout.regions_.push_back(MemoryRegion{.base = t.storage_ptr, .bytes = t.storage_bytes});
    } else if (it->second != t.storage_bytes) {
      return Refuse(name, absl::StrCat("storage at ", Hex(t.storage_ptr), " is described as ",
                                       t.storage_bytes, " bytes, but as ", it->second,
                                       " bytes by an earlier tensor"));
    }
  }
  return layout;
}

absl::StatusOr<KvCacheLayout> KvCacheLayout::FromSegments(std::vector<KvSegment> segments,
                                                          uint64_t num_blocks,
                                                          uint32_t block_size_tokens) {
  if (segments.empty()) return absl::InvalidArgumentError("no KV cache segments");
  if (num_blocks == 0) return absl::InvalidArgumentError("number of blocks is 0");
  for (size_t i = 0; i < segments.size(); ++i) {
    if (absl::Status s = CheckBlockSize(absl::StrCat("segment ", i), segments[i].block_bytes,
                                        block_size_tokens);
        !s.ok()) {
      return s;
    }
  }
  KvCacheLayout layout;
  layout.num_blocks_ = num_blocks;
  layout.block_size_tokens_ = block_size_tokens;
  layout.segments_ = std::move(segments);
  for (size_t i = 0; i < layout.segments_.size(); ++i) {
    layout.segment_tensors_.push_back(static_cast<int>(i));
  }
  return layout;
}

uint64_t KvCacheLayout::bytes_per_block() const {
  uint64_t total = 0;
  for (const KvSegment& segment : segments_) total += segment.block_bytes;
  return total;
}

std::string KvCacheLayout::DebugString() const {
  absl::flat_hash_map<uint64_t, int> lengths;
  for (const KvSegment& segment : segments_) ++lengths[segment.block_bytes];
  std::vector<std::string> parts;
  for (const auto& [bytes, count] : lengths) parts.push_back(absl::StrCat(count, "x", bytes));
  return absl::StrCat(segments_.size(), " segments (block bytes ", absl::StrJoin(parts, ", "),
                      "), ", regions_.size(), " regions, ", num_blocks_, " blocks of ",
                      block_size_tokens_, " tokens, ", bytes_per_block(), " bytes per chunk");
}

}  // namespace kvpool::engine
