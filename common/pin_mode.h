#pragma once

// How an object stands against eviction: the one definition, for the client's API
// (PutOptions::pin), the master's index and the manifests. The wire's v1::PinMode is converted
// to and from it in one place on each side (client/master_client.cc, the master's
// grpc_service.cc).

#include <cstdint>

namespace kvpool {

enum class PinMode : uint8_t {
  kNone = 0,
  // Evicted only when nothing unpinned can go.
  kSoft = 1,
  // Never evicted; removed only on request.
  kHard = 2,
};

}  // namespace kvpool
