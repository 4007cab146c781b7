#pragma once

// The checksum of a stored value: XXH3-64 over its bytes, in order, whatever buffers they
// are gathered from or scattered into. Computed by the writer, recorded by the master,
// checked by readers that ask for it.

#include <sys/uio.h>

#include <cstdint>

#include "absl/types/span.h"

namespace kvpool::wire {

uint64_t Checksum(absl::Span<const iovec> parts);

}  // namespace kvpool::wire
