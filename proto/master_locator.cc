#include "proto/master_locator.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/etcd/etcd_client.h"
#include "common/net.h"
#include "proto/channel.h"

namespace kvpool {
namespace {

std::string Metadata(const grpc::ClientContext& context, const char* key) {
  const auto& trailers = context.GetServerTrailingMetadata();
  auto it = trailers.find(key);
  if (it == trailers.end()) return "";
  return std::string(it->second.data(), it->second.size());
}

}  // namespace

std::string LeaderHint(const grpc::ClientContext& context) {
  std::string hint = Metadata(context, kLeaderMetadataKey);
  // Only a well-formed address is followed.
  if (!ParseHostPort(hint).ok()) return "";
  return hint;
}

bool AnsweredByStandby(const grpc::ClientContext& context) {
  return !Metadata(context, kStandbyMetadataKey).empty();
}

absl::Status ValidateMasterAddress(absl::string_view address) {
  absl::string_view rest = absl::StripAsciiWhitespace(address);
  if (absl::ConsumePrefix(&rest, "etcd://")) {
    absl::StatusOr<std::vector<std::string>> endpoints = etcd::ParseEndpoints(rest);
    if (!endpoints.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("master address \"", address, "\": ", endpoints.status().message()));
    }
    return absl::OkStatus();
  }
  return MasterLocator::Create(address).status();
}

absl::StatusOr<std::unique_ptr<MasterLocator>> MasterLocator::Create(absl::string_view address,
                                                                     std::string etcd_prefix,
                                                                     ClientTlsOptions tls) {
  std::unique_ptr<MasterLocator> locator(new MasterLocator());
  locator->tls_ = std::move(tls);
  locator->spec_ = std::string(address);
  locator->etcd_prefix_ = std::move(etcd_prefix);
  absl::string_view rest = absl::StripAsciiWhitespace(address);
  if (absl::ConsumePrefix(&rest, "etcd://")) {
    absl::StatusOr<std::unique_ptr<etcd::EtcdClient>> client =
        etcd::EtcdClient::Create(rest, absl::Seconds(1));
    if (!client.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("master address \"", address,
                                                     "\": ", client.status().message()));
    }
    locator->etcd_ = std::move(*client);
    absl::MutexLock lock(&locator->mu_);
    locator->RefreshLocked();
    return locator;
  }
  for (absl::string_view part : absl::StrSplit(rest, ',', absl::SkipWhitespace())) {
    part = absl::StripAsciiWhitespace(part);
    if (absl::StrContains(part, "://")) {
      return absl::InvalidArgumentError(
          absl::StrCat("master address \"", address, "\": \"", part,
                       "\" is not host:port (the only scheme is etcd://)"));
    }
    absl::StatusOr<HostPort> host_port = ParseHostPort(part);
    if (!host_port.ok() || host_port->port == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "master address \"", address, "\": \"", part,
          "\" is not host:port (give host:port, a comma-separated list of them, or "
          "etcd://host:port[,host:port])"));
    }
    if (std::find(locator->seeds_.begin(), locator->seeds_.end(), part) ==
        locator->seeds_.end()) {
      locator->seeds_.emplace_back(part);
    }
  }
  if (locator->seeds_.empty()) {
    return absl::InvalidArgumentError("master address is empty");
  }
  absl::MutexLock lock(&locator->mu_);
  locator->masters_ = locator->seeds_;
  locator->current_ = locator->seeds_.front();
  return locator;
}

MasterLocator::~MasterLocator() = default;

void MasterLocator::RefreshLocked() {
  if (etcd_ == nullptr || absl::Now() - refreshed_ < absl::Milliseconds(100)) return;
  refreshed_ = absl::Now();
  absl::StatusOr<std::vector<etcd::KeyValue>> members =
      etcd_->GetPrefix(etcd_prefix_ + "/members/");
  if (members.ok()) {
    masters_.clear();
    for (const etcd::KeyValue& member : *members) masters_.push_back(member.value);
  }
  absl::StatusOr<std::optional<etcd::KeyValue>> leader = etcd_->Get(etcd_prefix_ + "/leader");
  if (leader.ok() && leader->has_value() && ParseHostPort((*leader)->value).ok()) {
    current_ = (*leader)->value;
  } else if (current_.empty() && !masters_.empty()) {
    current_ = masters_.front();
  }
}

std::string MasterLocator::Current() {
  absl::MutexLock lock(&mu_);
  if (current_.empty()) RefreshLocked();
  // Nothing known (etcd unreachable, no master registered): a name that fails to connect.
  return current_.empty() ? "etcd-knows-no-master:1" : current_;
}

std::shared_ptr<grpc::Channel> MasterLocator::Channel(const std::string& address) {
  absl::MutexLock lock(&mu_);
  for (const auto& [known, entry] : channels_) {
    if (known == address) return entry.channel;
  }
  std::shared_ptr<grpc::Channel> channel = MakeMasterChannel(address, tls_);
  channels_.emplace_back(address, CachedChannel{channel, absl::Now()});
  return channel;
}

void MasterLocator::Failed(const std::string& address, const std::string& leader_hint) {
  absl::MutexLock lock(&mu_);
  // A channel that failed to connect stays failed through gRPC's backoff without dialling
  // again: the next call gets a fresh one (one per address at most every 250 ms).
  std::erase_if(channels_, [&](const auto& entry) {
    return entry.first == address && absl::Now() - entry.second.made >= absl::Milliseconds(250);
  });
  if (!leader_hint.empty() && leader_hint != address) {
    current_ = leader_hint;
    if (std::find(masters_.begin(), masters_.end(), leader_hint) == masters_.end()) {
      masters_.push_back(leader_hint);
    }
    return;
  }
  if (current_ != address) return;  // someone moved on already
  if (etcd_ != nullptr) {
    refreshed_ = absl::InfinitePast();
    RefreshLocked();
    if (current_ != address) return;
  }
  if (masters_.empty()) return;
  auto it = std::find(masters_.begin(), masters_.end(), address);
  size_t next = it == masters_.end() ? 0 : (it - masters_.begin() + 1) % masters_.size();
  current_ = masters_[next];
}

std::vector<std::string> MasterLocator::Masters() {
  absl::MutexLock lock(&mu_);
  RefreshLocked();
  return masters_;
}

}  // namespace kvpool
