#include "proto/checksum.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace kvpool::wire {

uint64_t Checksum(absl::Span<const iovec> parts) {
  if (parts.size() == 1) return XXH3_64bits(parts[0].iov_base, parts[0].iov_len);
  XXH3_state_t state;
  XXH3_64bits_reset(&state);
  for (const iovec& part : parts) XXH3_64bits_update(&state, part.iov_base, part.iov_len);
  return XXH3_64bits_digest(&state);
}

}  // namespace kvpool::wire
