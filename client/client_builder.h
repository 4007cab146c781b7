#pragma once

// Builds a Client over a given master client and, optionally, a given data-plane transport.
// Client::Create uses it with the gRPC master client and the routing transport; the client's
// unit tests (client_test.cc) with fakes of both. Internal to kvpool_client.

#include <memory>

#include "absl/status/statusor.h"
#include "client/master_client.h"
#include "client/transport.h"
#include "kvpool/client.h"

namespace kvpool {

class ClientBuilder {
 public:
  // Waits for `master` (WaitForMaster, options.connect_timeout) and loads the segment list
  // once. `transport`, if not null, moves every op of gets, puts and copies in place of the
  // routing transport (shared memory, RDMA, TCP); the zero-copy calls (BatchGetLocal,
  // BatchReserveLocal, ...) still use shared memory.
  static absl::StatusOr<std::unique_ptr<Client>> Build(
      const ClientOptions& options, std::unique_ptr<client::MasterClient> master,
      std::unique_ptr<client::Transport> transport);
};

}  // namespace kvpool
