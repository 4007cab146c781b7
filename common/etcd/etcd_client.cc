#include "common/etcd/etcd_client.h"

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/net.h"
#include "etcd/etcdserver/etcdserverpb/rpc.grpc.pb.h"
#include "grpcpp/grpcpp.h"

namespace kvpool::etcd {
namespace {

absl::Status FromGrpc(const grpc::Status& status, absl::string_view what,
                      absl::string_view endpoint) {
  if (status.ok()) return absl::OkStatus();
  std::string message =
      absl::StrCat("etcd ", endpoint, ": ", what, " failed: ", status.error_message());
  switch (status.error_code()) {
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return absl::DeadlineExceededError(message);
    case grpc::StatusCode::NOT_FOUND:
      return absl::NotFoundError(message);
    case grpc::StatusCode::INVALID_ARGUMENT:
      return absl::InvalidArgumentError(message);
    case grpc::StatusCode::FAILED_PRECONDITION:
      return absl::FailedPreconditionError(message);
    default:
      return absl::UnavailableError(message);
  }
}

bool EndpointFailed(const absl::Status& status) {
  return absl::IsUnavailable(status) || absl::IsDeadlineExceeded(status);
}

KeyValue FromProto(const mvccpb::KeyValue& kv) {
  return KeyValue{.key = kv.key(),
                  .value = kv.value(),
                  .create_revision = kv.create_revision(),
                  .mod_revision = kv.mod_revision(),
                  .lease = kv.lease()};
}

// The end of the range of keys that start with `prefix` (etcd's convention: the prefix with
// its last byte incremented; "\0" for every key).
std::string PrefixEnd(std::string prefix) {
  while (!prefix.empty()) {
    if (static_cast<unsigned char>(prefix.back()) < 0xff) {
      prefix.back() = static_cast<char>(prefix.back() + 1);
      return prefix;
    }
    prefix.pop_back();
  }
  return std::string(1, '\0');
}

}  // namespace

struct EtcdClient::Stubs {
  std::string endpoint;
  std::unique_ptr<etcdserverpb::KV::Stub> kv;
  std::unique_ptr<etcdserverpb::Lease::Stub> lease;
  std::unique_ptr<etcdserverpb::Watch::Stub> watch;
  absl::Time made;
};

absl::StatusOr<std::vector<std::string>> ParseEndpoints(absl::string_view endpoints) {
  std::vector<std::string> parsed;
  for (absl::string_view endpoint : absl::StrSplit(endpoints, ',', absl::SkipWhitespace())) {
    endpoint = absl::StripAsciiWhitespace(endpoint);
    absl::ConsumePrefix(&endpoint, "http://");
    absl::StatusOr<HostPort> host_port = ParseHostPort(endpoint);
    if (!host_port.ok() || host_port->port == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("etcd endpoint \"", endpoint, "\" is not host:port"));
    }
    parsed.emplace_back(endpoint);
  }
  if (parsed.empty()) return absl::InvalidArgumentError("no etcd endpoint given");
  return parsed;
}

absl::StatusOr<std::unique_ptr<EtcdClient>> EtcdClient::Create(absl::string_view endpoints,
                                                               absl::Duration rpc_timeout) {
  absl::StatusOr<std::vector<std::string>> parsed = ParseEndpoints(endpoints);
  if (!parsed.ok()) return parsed.status();
  return std::unique_ptr<EtcdClient>(new EtcdClient(std::move(*parsed), rpc_timeout));
}

namespace {

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& endpoint) {
  grpc::ChannelArguments args;
  // gRPC also lets one connection attempt take no longer than the minimum backoff: below a
  // second, attempts on a loaded machine are cut off mid-handshake.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 1000);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 1000);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  return grpc::CreateCustomChannel(endpoint, grpc::InsecureChannelCredentials(), args);
}

}  // namespace

std::shared_ptr<EtcdClient::Stubs> EtcdClient::MakeStubs(const std::string& endpoint) {
  std::shared_ptr<grpc::Channel> channel = MakeChannel(endpoint);
  auto stubs = std::make_shared<Stubs>();
  stubs->endpoint = endpoint;
  stubs->kv = etcdserverpb::KV::NewStub(channel);
  stubs->lease = etcdserverpb::Lease::NewStub(channel);
  stubs->watch = etcdserverpb::Watch::NewStub(channel);
  stubs->made = absl::Now();
  return stubs;
}

EtcdClient::EtcdClient(std::vector<std::string> endpoints, absl::Duration rpc_timeout)
    : endpoints_(std::move(endpoints)), rpc_timeout_(rpc_timeout) {
  absl::MutexLock lock(&mu_);
  for (const std::string& endpoint : endpoints_) stubs_.push_back(MakeStubs(endpoint));
}

EtcdClient::~EtcdClient() = default;

std::shared_ptr<EtcdClient::Stubs> EtcdClient::Current() {
  absl::MutexLock lock(&mu_);
  return stubs_[current_];
}

void EtcdClient::Failed(const Stubs& stubs) {
  absl::MutexLock lock(&mu_);
  for (std::shared_ptr<Stubs>& known : stubs_) {
    // A channel that failed to connect once stays failed for a while (gRPC answers from its
    // backoff state without dialling): a fresh one dials at once (at most every 250 ms).
    if (known.get() == &stubs && absl::Now() - known->made >= absl::Milliseconds(250)) {
      known = MakeStubs(known->endpoint);
    }
  }
  if (stubs_[current_].get() == &stubs || stubs_[current_]->endpoint == stubs.endpoint) {
    current_ = (current_ + 1) % stubs_.size();
  }
}

template <typename Invoke>
absl::Status EtcdClient::Unary(const char* method, Invoke invoke) {
  std::shared_ptr<Stubs> stubs = Current();
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + rpc_timeout_));
  absl::Status status = FromGrpc(invoke(*stubs, &context), method, stubs->endpoint);
  if (EndpointFailed(status)) Failed(*stubs);
  return status;
}

absl::StatusOr<Lease> EtcdClient::GrantLease(absl::Duration ttl) {
  etcdserverpb::LeaseGrantRequest request;
  request.set_ttl(std::max<int64_t>(1, absl::ToInt64Seconds(absl::Ceil(ttl, absl::Seconds(1)))));
  etcdserverpb::LeaseGrantResponse response;
  absl::Status status = Unary("LeaseGrant", [&](Stubs& stubs, grpc::ClientContext* context) {
    return stubs.lease->LeaseGrant(context, request, &response);
  });
  if (!status.ok()) return status;
  if (!response.error().empty()) {
    return absl::UnavailableError(absl::StrCat("etcd LeaseGrant: ", response.error()));
  }
  return Lease{.id = response.id(), .ttl = absl::Seconds(response.ttl())};
}

absl::StatusOr<absl::Duration> EtcdClient::KeepAlive(int64_t lease) {
  std::shared_ptr<Stubs> stubs = Current();
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + rpc_timeout_));
  // One round trip per stream: a stream that outlives an etcd restart or a cut network would
  // hide it; a fresh one with a deadline cannot.
  std::unique_ptr<grpc::ClientReaderWriter<etcdserverpb::LeaseKeepAliveRequest,
                                           etcdserverpb::LeaseKeepAliveResponse>>
      stream = stubs->lease->LeaseKeepAlive(&context);
  etcdserverpb::LeaseKeepAliveRequest request;
  request.set_id(lease);
  etcdserverpb::LeaseKeepAliveResponse response;
  bool answered = stream->Write(request) && stream->Read(&response);
  context.TryCancel();
  grpc::Status finished = stream->Finish();
  if (!answered) {
    absl::Status status = FromGrpc(finished.ok() ? grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                                                "stream closed")
                                                 : finished,
                                   "LeaseKeepAlive", stubs->endpoint);
    if (EndpointFailed(status)) Failed(*stubs);
    return status;
  }
  if (response.ttl() <= 0) {
    return absl::NotFoundError(absl::StrCat("etcd lease ", lease, " expired"));
  }
  return absl::Seconds(response.ttl());
}

absl::Status EtcdClient::RevokeLease(int64_t lease) {
  etcdserverpb::LeaseRevokeRequest request;
  request.set_id(lease);
  etcdserverpb::LeaseRevokeResponse response;
  return Unary("LeaseRevoke", [&](Stubs& stubs, grpc::ClientContext* context) {
    return stubs.lease->LeaseRevoke(context, request, &response);
  });
}

absl::StatusOr<CreateResult> EtcdClient::CreateIfAbsent(const std::string& key,
                                                        const std::string& value, int64_t lease) {
  etcdserverpb::TxnRequest request;
  etcdserverpb::Compare* absent = request.add_compare();
  absent->set_result(etcdserverpb::Compare::EQUAL);
  absent->set_target(etcdserverpb::Compare::CREATE);
  absent->set_key(key);
  absent->set_create_revision(0);
  etcdserverpb::PutRequest* put = request.add_success()->mutable_request_put();
  put->set_key(key);
  put->set_value(value);
  put->set_lease(lease);
  request.add_failure()->mutable_request_range()->set_key(key);
  etcdserverpb::TxnResponse response;
  absl::Status status = Unary("Txn", [&](Stubs& stubs, grpc::ClientContext* context) {
    return stubs.kv->Txn(context, request, &response);
  });
  if (!status.ok()) return status;
  CreateResult result;
  result.created = response.succeeded();
  result.revision = response.header().revision();
  if (!result.created && response.responses_size() > 0 &&
      response.responses(0).response_range().kvs_size() > 0) {
    result.existing = FromProto(response.responses(0).response_range().kvs(0));
  }
  return result;
}

absl::Status EtcdClient::Put(const std::string& key, const std::string& value, int64_t lease) {
  etcdserverpb::PutRequest request;
  request.set_key(key);
  request.set_value(value);
  request.set_lease(lease);
  etcdserverpb::PutResponse response;
  return Unary("Put", [&](Stubs& stubs, grpc::ClientContext* context) {
    return stubs.kv->Put(context, request, &response);
  });
}

absl::StatusOr<std::optional<KeyValue>> EtcdClient::Get(const std::string& key) {
  etcdserverpb::RangeRequest request;
  request.set_key(key);
  etcdserverpb::RangeResponse response;
  absl::Status status = Unary("Range", [&](Stubs& stubs, grpc::ClientContext* context) {
    return stubs.kv->Range(context, request, &response);
  });
  if (!status.ok()) return status;
  if (response.kvs_size() == 0) return std::optional<KeyValue>();
  return std::optional<KeyValue>(FromProto(response.kvs(0)));
}

absl::StatusOr<std::vector<KeyValue>> EtcdClient::GetPrefix(const std::string& prefix) {
  etcdserverpb::RangeRequest request;
  request.set_key(prefix);
  request.set_range_end(PrefixEnd(prefix));
  etcdserverpb::RangeResponse response;
  absl::Status status = Unary("Range", [&](Stubs& stubs, grpc::ClientContext* context) {
    return stubs.kv->Range(context, request, &response);
  });
  if (!status.ok()) return status;
  std::vector<KeyValue> kvs;
  for (const mvccpb::KeyValue& kv : response.kvs()) kvs.push_back(FromProto(kv));
  return kvs;
}

absl::Status EtcdClient::Delete(const std::string& key) {
  etcdserverpb::DeleteRangeRequest request;
  request.set_key(key);
  etcdserverpb::DeleteRangeResponse response;
  return Unary("DeleteRange", [&](Stubs& stubs, grpc::ClientContext* context) {
    return stubs.kv->DeleteRange(context, request, &response);
  });
}

absl::StatusOr<bool> EtcdClient::WaitForChange(const std::string& key, int64_t after_revision,
                                               absl::Duration timeout) {
  std::shared_ptr<Stubs> stubs = Current();
  grpc::ClientContext context;
  absl::Time deadline = absl::Now() + timeout;
  context.set_deadline(absl::ToChronoTime(deadline));
  std::unique_ptr<grpc::ClientReaderWriter<etcdserverpb::WatchRequest,
                                           etcdserverpb::WatchResponse>>
      stream = stubs->watch->Watch(&context);
  etcdserverpb::WatchRequest request;
  etcdserverpb::WatchCreateRequest* create = request.mutable_create_request();
  create->set_key(key);
  create->set_start_revision(after_revision + 1);
  bool changed = false;
  bool read_any = false;
  if (stream->Write(request)) {
    etcdserverpb::WatchResponse response;
    while (stream->Read(&response)) {
      read_any = true;
      if (response.events_size() > 0 || response.canceled() || response.compact_revision() > 0) {
        changed = true;
        break;
      }
    }
  }
  context.TryCancel();
  grpc::Status finished = stream->Finish();
  if (changed) return true;
  // Running out of time is the normal end of a watch that saw nothing.
  if (read_any || absl::Now() >= deadline ||
      finished.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    return false;
  }
  absl::Status status = FromGrpc(
      finished.ok() ? grpc::Status(grpc::StatusCode::UNAVAILABLE, "stream closed") : finished,
      "Watch", stubs->endpoint);
  if (EndpointFailed(status)) Failed(*stubs);
  return status;
}

}  // namespace kvpool::etcd
