#pragma once

// Byte sizes as people write them: "4GiB", "512MB", "80GB", "1.5 GiB", "4096".
// KB/MB/GB/TB and KiB/MiB/GiB/TiB are both powers of 1024, as in Mooncake's configuration
// files, which engines already write (global_segment_size: "80GB").

#include <cstdint>
#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"

namespace kvpool {

// InvalidArgument, with the reason, for empty, negative, malformed or overflowing input.
absl::StatusOr<uint64_t> ParseSize(absl::string_view text);

// "512 B", "1.50 KiB", "4.00 GiB".
std::string FormatSize(uint64_t bytes);

// A size usable as an Abseil flag type: ABSL_FLAG(kvpool::ByteSize, size, ...).
struct ByteSize {
  uint64_t bytes = 0;
};
bool AbslParseFlag(absl::string_view text, ByteSize* size, std::string* error);
std::string AbslUnparseFlag(ByteSize size);

}  // namespace kvpool
