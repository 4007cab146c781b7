#pragma once

// What the engine plugin needs from a KV store: existence checks and batched gather-puts and
// scatter-gets of chunk values. Store (store.h) implements it over kvpool::Client; tests
// implement it with mocks. Implementations must be thread-safe: the sending and receiving
// threads call them concurrently.
//
// Per-key statuses follow kvpool::Client (client/include/kvpool/client.h): put gives OK,
// AlreadyExists (stored by someone else: nothing written), ResourceExhausted (the pool is
// under pressure, NO_AVAILABLE_HANDLE) or a transfer/RPC failure; get gives the bytes read,
// NotFound, or a failure.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kvpool/client.h"

namespace kvpool::engine {

class StoreBackend {
 public:
  virtual ~StoreBackend() = default;

  // Per key: whether a committed object has it, or why that could not be told.
  virtual std::vector<absl::StatusOr<bool>> BatchExist(absl::Span<const std::string> keys) = 0;
  // Per item, in order; each value is the concatenation of the item's parts.
  virtual std::vector<absl::Status> BatchPut(absl::Span<const PutItem> items) = 0;
  // Per item, in order: bytes read into the item's parts.
  virtual std::vector<absl::StatusOr<uint64_t>> BatchGet(absl::Span<const GetItem> items) = 0;
  // Declares memory that puts and gets will use (KV cache storages), once per allocation.
  virtual absl::Status RegisterBuffer(uint64_t base, uint64_t bytes) = 0;
};

}  // namespace kvpool::engine
