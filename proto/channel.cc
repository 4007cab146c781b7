#include "proto/channel.h"

#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/channel_arguments.h"

namespace kvpool {

std::shared_ptr<grpc::Channel> MakeMasterChannel(const std::string& address) {
  grpc::ChannelArguments args;
  // Try a lost master again every second. gRPC uses the "minimum reconnect backoff" both as
  // the least time between attempts and as the time one attempt may take: far below a second,
  // attempts on a loaded machine are cut off before their handshake completes.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 1000);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 1000);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  args.SetMaxReceiveMessageSize(64 << 20);
  args.SetMaxSendMessageSize(64 << 20);
  return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
}

}  // namespace kvpool
