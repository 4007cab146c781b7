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

struct ChecksumStream::State {
  XXH3_state_t xxh3;
};

void ChecksumStream::Free::operator()(State* state) const {
  XXH3_freeState(reinterpret_cast<XXH3_state_t*>(state));
}

// XXH3_createState allocates the state with the alignment it needs (64 bytes).
ChecksumStream::ChecksumStream() : state_(reinterpret_cast<State*>(XXH3_createState())) {
  Reset();
}

ChecksumStream::~ChecksumStream() = default;

void ChecksumStream::Reset() { XXH3_64bits_reset(&state_->xxh3); }

void ChecksumStream::Update(const void* data, size_t size) {
  XXH3_64bits_update_dispatch(&state_->xxh3, data, size);
}

uint64_t ChecksumStream::Digest() const { return XXH3_64bits_digest(&state_->xxh3); }

}  // namespace kvpool::wire
