#pragma once

#include <memory>
#include <string>

#include "grpcpp/channel.h"

namespace kvpool {

// A gRPC channel to kvpool-master that finds a restarted master within about a second
// instead of backing off for minutes, with message limits that fit large batches.
std::shared_ptr<grpc::Channel> MakeMasterChannel(const std::string& address);

}  // namespace kvpool
