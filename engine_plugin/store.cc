#include "engine_plugin/store.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/net.h"
#include "proto/tls.h"

namespace kvpool::engine {
namespace {

absl::Status Closed() { return absl::FailedPreconditionError("the store is closed"); }

// Runs `run(items, places)` on the items whose status is OK and returns per item its result,
// or its status where that is not OK. `places` lists every item's parts in order.
template <typename Result, typename Item, typename Run>
std::vector<Result> OnValidItems(absl::Span<const Item> items,
                                 const std::vector<absl::Status>& item_status,
                                 absl::Span<const MemoryPlace> places, Run run) {
  if (std::all_of(item_status.begin(), item_status.end(),
                  [](const absl::Status& s) { return s.ok(); })) {
    return run(items, places);
  }
  std::vector<Item> valid;
  std::vector<MemoryPlace> valid_places;
  size_t place = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    if (item_status[i].ok()) {
      valid.push_back(items[i]);
      valid_places.insert(valid_places.end(), places.begin() + place,
                          places.begin() + place + items[i].parts.size());
    }
    place += items[i].parts.size();
  }
  std::vector<Result> results = run(absl::MakeConstSpan(valid), absl::MakeConstSpan(valid_places));
  std::vector<Result> out;
  out.reserve(items.size());
  size_t next = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    if (item_status[i].ok()) {
      out.push_back(std::move(results[next++]));
    } else {
      out.push_back(item_status[i]);
    }
  }
  return out;
}

// Where the in-process segment listens, from Mooncake's local_hostname: an IP or a host name
// ("localhost", "node-3"), with or without ":port". A name is resolved to the address the
// segment binds; it is still advertised (and named) by that name, as Mooncake names a
// client's segment "localhost:12345".
absl::StatusOr<segment::SegmentOptions> InProcessSegmentOptions(const StoreConfig& config) {
  segment::SegmentOptions options;
  options.master_address = config.master_server_address;
  options.size = config.global_segment_size;
  // Pages arrive on first write: touching a big segment up front would stall setup().
  options.prefault = false;
  options.mount_timeout = absl::Seconds(10);
  const std::string& local = config.local_hostname;
  if (local.empty()) {
    // Loopback when the master is local; otherwise every interface, advertised by name.
    absl::StatusOr<HostPort> master = ParseHostPort(config.master_server_address);
    bool loopback = master.ok() && (master->host == "127.0.0.1" || master->host == "localhost" ||
                                    master->host == "::1");
    options.listen = loopback ? "127.0.0.1:0" : "0.0.0.0:0";
    return options;
  }
  HostPort where{local, 0};
  // "host:port" or "[v6]:port"; a bare IPv6 literal has several colons and no port.
  if (absl::StatusOr<HostPort> parsed = ParseHostPort(local);
      parsed.ok() && (local.front() == '[' || local.find(':') == local.rfind(':'))) {
    where = *parsed;
  }
  absl::StatusOr<std::string> ip = ResolveHost(where.host);
  if (!ip.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("local_hostname \"", local, "\": ", ip.status().message()));
  }
  options.listen = FormatHostPort(*ip, where.port);
  if (*ip != where.host) options.advertise_host = where.host;
  return options;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Store>> Store::Open(const StoreConfig& config,
                                                   const ClientOptions& client_options,
                                                   const std::string& segment_auth_token) {
  if (config.protocol == "rdma") {
    KVPOOL_LOG(WARNING) << "protocol \"rdma\" requested; kvpool moves the bytes over TCP until "
                           "its RDMA transport is available";
  }
  // The in-process segment starts first: the client then knows its host as this machine's
  // (PutOptions::prefer_local_segment, Mooncake's prefer_alloc_in_same_node, places there).
  std::unique_ptr<segment::Segment> segment;
  if (config.global_segment_size > 0) {
    absl::StatusOr<segment::SegmentOptions> segment_options = InProcessSegmentOptions(config);
    if (!segment_options.ok()) return segment_options.status();
    segment_options->master_tls = {.ca_file = client_options.tls_ca_file,
                                   .cert_file = client_options.tls_cert_file,
                                   .key_file = client_options.tls_key_file,
                                   .server_name = client_options.tls_server_name};
    segment_options->master_auth_token = segment_auth_token;
    if (client_options.data_tls) {
      // The whole pool's data plane speaks TLS: this segment serves its data port with the
      // certificate it presents to the master.
      if (client_options.tls_cert_file.empty() || client_options.tls_key_file.empty()) {
        return absl::InvalidArgumentError(
            "data-plane TLS with an in-process segment (global_segment_size > 0) needs its "
            "certificate and key (KVPOOL_TLS_CERT, KVPOOL_TLS_KEY)");
      }
      // Segment::Start checks the files (ValidateServerTls) and fails naming the bad one.
      segment_options->data.tls = ServerTlsOptions{.cert_file = client_options.tls_cert_file,
                                                   .key_file = client_options.tls_key_file};
    }
    absl::StatusOr<std::unique_ptr<segment::Segment>> started =
        segment::Segment::Start(*segment_options);
    if (!started.ok()) return started.status();
    segment = std::move(*started);
  }
  ClientOptions options = client_options;
  options.master_address = config.master_server_address;
  if (segment != nullptr && options.local_host.empty()) options.local_host = segment->host();
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Create(options);
  if (!client.ok()) {
    if (segment != nullptr) segment->Stop();
    return client.status();
  }
  return std::unique_ptr<Store>(
      new Store(config, std::shared_ptr<Client>(std::move(*client)), std::move(segment)));
}

Store::Store(StoreConfig config, std::shared_ptr<Client> client,
             std::unique_ptr<segment::Segment> segment)
    : config_(std::move(config)), client_(std::move(client)), segment_(std::move(segment)) {}

Store::~Store() { Close(); }

std::shared_ptr<Client> Store::client() const {
  absl::MutexLock lock(&mu_);
  return client_;
}

void Store::Close() {
  std::shared_ptr<segment::Segment> segment;
  std::shared_ptr<Client> client;
  {
    absl::MutexLock lock(&mu_);
    segment = std::move(segment_);
    client = std::move(client_);
    buffers_.clear();
  }
  if (segment != nullptr) segment->Stop();
  // The client goes when the last call still using it returns.
}

bool Store::closed() const {
  absl::MutexLock lock(&mu_);
  return client_ == nullptr;
}

std::vector<absl::StatusOr<bool>> Store::BatchExist(absl::Span<const std::string> keys) {
  std::shared_ptr<Client> c = client();
  if (c == nullptr) return std::vector<absl::StatusOr<bool>>(keys.size(), Closed());
  return c->BatchExist(keys);
}

std::vector<absl::Status> Store::BatchPut(absl::Span<const PutItem> items) {
  return BatchPut(items, PutOptions{.replicas = config_.replica_num});
}

std::vector<absl::Status> Store::BatchPut(absl::Span<const PutItem> items,
                                          const PutOptions& options) {
  std::shared_ptr<Client> c = client();
  if (c == nullptr) return std::vector<absl::Status>(items.size(), Closed());
  std::vector<absl::Status> item_status(items.size());
  std::vector<MemoryPlace> places = PlacesOf(items, item_status);
  auto put = [&](absl::Span<const PutItem> some) { return c->BatchPut(some, options); };
  return OnValidItems<absl::Status>(
      items, item_status, places,
      [&](absl::Span<const PutItem> valid, absl::Span<const MemoryPlace> valid_places) {
        bool device = std::any_of(valid_places.begin(), valid_places.end(),
                                  [](MemoryPlace p) { return p.on_device(); });
        return device ? staging_.Put(valid, valid_places, put) : put(valid);
      });
}

std::vector<absl::StatusOr<uint64_t>> Store::BatchGet(absl::Span<const GetItem> items) {
  std::shared_ptr<Client> c = client();
  if (c == nullptr) return std::vector<absl::StatusOr<uint64_t>>(items.size(), Closed());
  std::vector<absl::Status> item_status(items.size());
  std::vector<MemoryPlace> places = PlacesOf(items, item_status);
  auto get = [&](absl::Span<const GetItem> some) { return c->BatchGet(some); };
  return OnValidItems<absl::StatusOr<uint64_t>>(
      items, item_status, places,
      [&](absl::Span<const GetItem> valid, absl::Span<const MemoryPlace> valid_places) {
        bool device = std::any_of(valid_places.begin(), valid_places.end(),
                                  [](MemoryPlace p) { return p.on_device(); });
        return device ? staging_.Get(valid, valid_places, get) : get(valid);
      });
}

std::optional<MemoryPlace> Store::RegisteredPlaceLocked(uint64_t ptr, uint64_t bytes) const {
  auto it = buffers_.upper_bound(ptr);
  if (it == buffers_.begin()) return std::nullopt;
  --it;
  uint64_t offset = ptr - it->first;
  if (offset >= it->second.bytes || bytes > it->second.bytes - offset) return std::nullopt;
  return it->second.place;
}

template <typename Item>
std::vector<MemoryPlace> Store::PlacesOf(absl::Span<const Item> items,
                                         std::vector<absl::Status>& item_status) {
  size_t parts = 0;
  for (const Item& item : items) parts += item.parts.size();
  // Without CUDA in this process there is no device memory: nothing to look up.
  if (staging_.driver() == nullptr) return std::vector<MemoryPlace>(parts);
  std::vector<std::optional<MemoryPlace>> registered;
  registered.reserve(parts);
  {
    absl::MutexLock lock(&mu_);
    for (const Item& item : items) {
      for (const auto& part : item.parts) {
        registered.push_back(
            RegisteredPlaceLocked(reinterpret_cast<uint64_t>(part.data), part.size));
      }
    }
  }
  std::vector<MemoryPlace> places;
  places.reserve(parts);
  for (size_t i = 0, place = 0; i < items.size(); ++i) {
    for (const auto& part : items[i].parts) {
      std::optional<MemoryPlace>& known = registered[place++];
      if (!known.has_value()) {
        // Outside the registered buffers: asked of the driver.
        absl::StatusOr<MemoryPlace> located =
            staging_.Locate(reinterpret_cast<uint64_t>(part.data), part.size);
        if (!located.ok() && item_status[i].ok()) {
          item_status[i] =
              absl::Status(located.status().code(),
                           absl::StrCat(items[i].key, ": ", located.status().message()));
        }
        known = located.value_or(MemoryPlace{});
      }
      places.push_back(*known);
    }
  }
  return places;
}

absl::Status Store::RegisterBuffer(uint64_t base, uint64_t bytes) {
  if (base == 0 || bytes == 0) {
    return absl::InvalidArgumentError("cannot register a null or empty buffer");
  }
  if (bytes > UINT64_MAX - base) return absl::InvalidArgumentError("buffer wraps around");
  absl::MutexLock lock(&mu_);
  if (client_ == nullptr) return Closed();
  auto it = buffers_.find(base);
  if (it != buffers_.end() && it->second.bytes == bytes) return absl::OkStatus();
  // The buffer starting at or before `base`, and the one after it, must not overlap.
  auto next = buffers_.upper_bound(base);
  if (next != buffers_.end() && next->first < base + bytes) {
    return absl::InvalidArgumentError(absl::StrCat("buffer [0x", absl::Hex(base), ", +", bytes,
                                                   ") overlaps the registered buffer at 0x",
                                                   absl::Hex(next->first)));
  }
  if (next != buffers_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second.bytes > base) {
      return absl::InvalidArgumentError(absl::StrCat("buffer [0x", absl::Hex(base), ", +", bytes,
                                                     ") overlaps the registered buffer at 0x",
                                                     absl::Hex(prev->first)));
    }
  }
  absl::StatusOr<MemoryPlace> place = staging_.Locate(base, bytes);
  if (!place.ok()) return place.status();
  buffers_.emplace(base, Registered{.bytes = bytes, .place = *place});
  // With an RDMA device the buffer is registered now rather than on its first transfer;
  // without one there is nothing more to do.
  absl::Status registered = client_->RegisterMemory(reinterpret_cast<void*>(base), bytes);
  if (!registered.ok() && registered.code() != absl::StatusCode::kUnavailable) return registered;
  return absl::OkStatus();
}

absl::Status Store::UnregisterBuffer(uint64_t base) {
  absl::MutexLock lock(&mu_);
  if (client_ == nullptr) return Closed();
  if (buffers_.erase(base) == 0) {
    return absl::NotFoundError(absl::StrCat("no buffer is registered at 0x", absl::Hex(base)));
  }
  return absl::OkStatus();
}

std::vector<std::pair<uint64_t, uint64_t>> Store::RegisteredBuffers() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::pair<uint64_t, uint64_t>> out;
  for (const auto& [base, buffer] : buffers_) out.emplace_back(base, buffer.bytes);
  return out;
}

absl::StatusOr<std::string> Store::ReadBytes(uint64_t ptr, size_t bytes) {
  absl::StatusOr<MemoryPlace> place = staging_.Locate(ptr, bytes);
  if (!place.ok()) return place.status();
  std::string out(bytes, '\0');
  absl::Status copied = staging_.CopyOut(out.data(), ptr, bytes, *place);
  if (!copied.ok()) return copied;
  return out;
}

absl::Status Store::WriteBytes(uint64_t ptr, absl::string_view data) {
  absl::StatusOr<MemoryPlace> place = staging_.Locate(ptr, data.size());
  if (!place.ok()) return place.status();
  return staging_.CopyIn(ptr, data.data(), data.size(), *place);
}

bool Store::OnDevice(uint64_t ptr) {
  absl::StatusOr<MemoryPlace> place = staging_.Locate(ptr, 1);
  return place.ok() && place->on_device();
}

absl::Status Store::Put(absl::string_view key, absl::string_view value) {
  std::shared_ptr<Client> c = client();
  if (c == nullptr) return Closed();
  return c->Put(key, value, PutOptions{.replicas = config_.replica_num});
}

absl::StatusOr<std::string> Store::Get(absl::string_view key) {
  std::shared_ptr<Client> c = client();
  if (c == nullptr) return Closed();
  return c->Get(key);
}

absl::StatusOr<bool> Store::Exists(absl::string_view key) {
  std::shared_ptr<Client> c = client();
  if (c == nullptr) return Closed();
  return c->Exists(key);
}

absl::StatusOr<uint64_t> Store::Size(absl::string_view key) {
  std::shared_ptr<Client> c = client();
  if (c == nullptr) return Closed();
  return c->Size(key);
}

absl::Status Store::Remove(absl::string_view key, bool force) {
  std::shared_ptr<Client> c = client();
  if (c == nullptr) return Closed();
  return c->Remove(key, force);
}

absl::StatusOr<uint64_t> Store::RemoveAll(bool force) {
  std::shared_ptr<Client> c = client();
  if (c == nullptr) return Closed();
  return c->RemoveAll(force);
}

absl::StatusOr<ClusterStatus> Store::GetClusterStatus() {
  std::shared_ptr<Client> c = client();
  if (c == nullptr) return Closed();
  return c->GetClusterStatus();
}

std::optional<std::string> Store::local_segment_name() const {
  absl::MutexLock lock(&mu_);
  if (segment_ == nullptr) return std::nullopt;
  return segment_->name();
}

std::optional<segment::DataServer::Stats> Store::local_segment_stats() const {
  absl::MutexLock lock(&mu_);
  if (segment_ == nullptr) return std::nullopt;
  return segment_->stats();
}

}  // namespace kvpool::engine
