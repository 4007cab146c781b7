#include "proto/channel.h"

#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/channel_arguments.h"

namespace kvpool {

std::shared_ptr<grpc::Channel> MakeMasterChannel(const std::string& address,
                                                 const ClientTlsOptions& tls) {
  grpc::ChannelArguments args;
  // Try a lost master again every second. gRPC uses the "minimum reconnect backoff" both as
  // the least time between attempts and as the time one attempt may take: far below a second,
  // attempts on a loaded machine are cut off before their handshake completes.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 1000);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 1000);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  args.SetMaxReceiveMessageSize(64 << 20);
  args.SetMaxSendMessageSize(64 << 20);
  if (tls.enabled() && !tls.server_name.empty()) {
    args.SetSslTargetNameOverride(tls.server_name);
  }
  return grpc::CreateCustomChannel(address, MakeChannelCredentials(tls), args);
}

void AttachToken(grpc::ClientContext& context, const std::string& token) {
  if (!token.empty()) context.AddMetadata("authorization", "Bearer " + token);
}


absl::StatusOr<std::string> ReadTokenFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::InvalidArgumentError(absl::StrCat("cannot read token file ", path));
  std::stringstream text;
  text << in.rdbuf();
  std::string token(absl::StripAsciiWhitespace(text.str()));
  if (token.empty()) return absl::InvalidArgumentError(absl::StrCat("token file ", path, " is empty"));
  return token;
}

}  // namespace kvpool
