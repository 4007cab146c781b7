#include "proto/checksum.h"

// The library's runtime dispatch picks the widest vector unit the CPU has (AVX2, AVX-512),
// whatever the build targets: checksums run at memory speed on the writer's hot path.
#define XXH_STATIC_LINKING_ONLY
#include <xxh_x86dispatch.h>
#include <xxhash.h>

namespace kvpool::wire {

uint64_t Checksum(absl::Span<const iovec> parts) {
  if (parts.size() == 1) return XXH3_64bits_dispatch(parts[0].iov_base, parts[0].iov_len);
  XXH3_state_t state;
  XXH3_64bits_reset(&state);
  for (const iovec& part : parts) XXH3_64bits_update_dispatch(&state, part.iov_base, part.iov_len);
  return XXH3_64bits_digest(&state);
}

}  // namespace kvpool::wire
