#include "kvpool/client.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <mutex>
#include <numeric>
#include <thread>

#include "absl/strings/str_cat.h"
#include "client/master_client.h"
#include "client/routing_transport.h"
#include "client/tcp_transport.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "common/latency_histogram.h"
#include "common/task_pool.h"
#include "common/metric_families.h"
#include "kvpool/client_metrics.h"
#include "common/net.h"
#include "proto/checksum.h"
#include "proto/error_codes.h"
#include "proto/tls.h"

namespace kvpool {

using client::TransferOp;

namespace {

absl::StatusOr<wire::Token> TokenFrom(const std::string& bytes) {
  wire::Token token;
  if (bytes.size() != token.size()) {
    return absl::InternalError(absl::StrCat("master sent a ", bytes.size(), "-byte token"));
  }
  std::memcpy(token.data(), bytes.data(), token.size());
  return token;
}

// The op moving `size` bytes between `iov` and `placement`. InternalError for a placement the
// master got wrong: a token of the wrong size, or a length other than `size`.
absl::StatusOr<TransferOp> MakeOp(wire::Opcode opcode, const v1::Placement& placement,
                                  uint64_t size, std::vector<iovec> iov) {
  absl::StatusOr<wire::Token> token = TokenFrom(placement.token());
  if (!token.ok()) return token.status();
  if (placement.length() != size) {
    return absl::InternalError(absl::StrCat("master placed ", placement.length(),
                                            " bytes for an object of ", size));
  }
  return TransferOp{.opcode = opcode,
                    .endpoint = placement.endpoint(),
                    .host = placement.host(),
                    .incarnation = placement.incarnation(),
                    .offset = placement.offset(),
                    .length = size,
                    .token = *token,
                    .iov = std::move(iov)};
}

absl::Status CountMismatch(size_t got, size_t expected) {
  return absl::InternalError(
      absl::StrCat("master answered ", got, " results for ", expected, " keys"));
}

// One status per key from an answer of KeyResults for `n` keys: the call's failure for every
// key, or CountMismatch's if the master answered another number of results.
template <typename Response>
std::vector<absl::Status> KeyStatuses(const absl::StatusOr<Response>& response, size_t n) {
  if (!response.ok()) return std::vector<absl::Status>(n, response.status());
  if (response->results_size() != static_cast<int>(n)) {
    return std::vector<absl::Status>(n, CountMismatch(response->results_size(), n));
  }
  std::vector<absl::Status> results;
  results.reserve(n);
  for (const v1::KeyResult& result : response->results()) {
    results.push_back(FromErrorCode(result.code(), result.message()));
  }
  return results;
}

// The first `size` bytes of `parts`, as an iovec list.
std::vector<iovec> Truncated(absl::Span<const MutableBuffer> parts, uint64_t size) {
  std::vector<iovec> iov;
  for (const MutableBuffer& part : parts) {
    if (size == 0) break;
    size_t take = std::min<uint64_t>(part.size, size);
    if (take > 0) iov.push_back(iovec{part.data, take});
    size -= take;
  }
  return iov;
}

ClientTlsOptions TlsOptionsOf(const ClientOptions& options) {
  return ClientTlsOptions{.ca_file = options.tls_ca_file,
                          .cert_file = options.tls_cert_file,
                          .key_file = options.tls_key_file,
                          .server_name = options.tls_server_name};
}

}  // namespace

struct Client::Impl {
  Impl(const ClientOptions& o, std::unique_ptr<MasterLocator> locator)
      : options(o),
        local_host(o.local_host.empty() ? LocalHostName() : o.local_host),
        machine_id(MachineId()),
        master(std::move(locator), o.rpc_timeout, TlsOptionsOf(o), o.auth_token),
        transport(std::make_unique<client::RoutingTransport>(
            o.transport,
            [this](const std::string& endpoint) { return ShmSocketOf(endpoint); },
            client::TcpTransportOptions{.connections_per_endpoint = o.connections_per_segment},
            o.rdma_device)) {}

  // The shared-memory socket of a segment, from the master's segment list (cached; asked
  // again at most once a second for an endpoint it does not know).
  std::optional<std::string> ShmSocketOf(const std::string& endpoint) ABSL_LOCKS_EXCLUDED(shm_mu);
  // Maps the pools of the segments of this machine known so far, before any placement or
  // lease is asked for: mapping (and populating) a large pool can take longer than a write
  // grant or a lease lasts (30 s for 4 GiB on a loaded machine), so it must not happen
  // between a placement and its bytes. Pools mapped already cost a lookup each.
  void MapKnownLocalPools() ABSL_LOCKS_EXCLUDED(shm_mu);

  absl::Time TransferDeadline() const { return absl::Now() + options.transfer_timeout; }

  // A key's answer from the master, or from the location cache within the lease that
  // answer granted: while it runs the object can be neither evicted nor removed (unless
  // forced), so its placement still holds.
  struct Located {
    std::string key;
    v1::GetResult result;
    absl::Time lease_expiry;
    bool cached = false;
  };

  // Step G1 for `keys`: from the cache where a lease has more than half of it (and at least
  // kCacheMargin) to run, from the master (one call) for the rest. A cached location asked
  // for again is still used, if its lease has kFallbackMargin to run, when the master cannot
  // answer for it: the call fails (no leader, during a fail-over: when every key has a cached
  // location the call waits kRenewTimeout at most) or says OBJECT_NOT_FOUND (a new leader
  // whose index has not yet been rebuilt from the segment's manifest). Renewing at half the
  // lease leaves the rest of it (5 s of the default 10 s) to ride out a fail-over, which takes
  // about the masters' etcd lease (3 s). A whole-call failure is the status.
  absl::StatusOr<std::vector<Located>> Locate(absl::Span<const std::string> keys)
      ABSL_LOCKS_EXCLUDED(cache_mu);
  void ForgetLocations(absl::Span<const std::string> keys) ABSL_LOCKS_EXCLUDED(cache_mu);

  // Step G2: reads the located objects `wanted` (indices into `located`) into their target
  // buffers, trying replicas on this host first, then the others, until one succeeds, and
  // sets their results. `targets[i]` must hold located[i].result.size() bytes. Checks
  // checksums when asked, always for a cached location, and always for a read that finished
  // after its lease ran out (LEASE_EXPIRED if the bytes changed). A cached location that
  // fails is forgotten and answered LEASE_EXPIRED, which the callers retry with the master.
  void ReadLocated(const std::vector<Located>& located, std::vector<size_t> wanted,
                   const std::vector<std::vector<iovec>>& targets, const GetOptions& options,
                   std::vector<absl::StatusOr<uint64_t>>& results);

  // Steps P1 to P3 for a batch.
  std::vector<absl::Status> BatchPutOnce(absl::Span<const PutItem> items,
                                         const PutOptions& options);

  // Steps G1 and G2 for one key whose size the caller does not know.
  absl::StatusOr<std::string> GetValue(absl::string_view key, const GetOptions& options);

  // Step G1 then G2 for a batch, once.
  std::vector<absl::StatusOr<uint64_t>> BatchGetOnce(absl::Span<const GetItem> items,
                                                     const GetOptions& options);

  // Copies the objects of a draining segment as the master planned them: reads each from its
  // source into `buffer`, checks its checksum, writes it to its destination. Whether each
  // copy was made, in order.
  std::vector<bool> CopyMigrations(const google::protobuf::RepeatedPtrField<v1::Migration>& batch,
                                   std::string& buffer);
  void MapLocalPools();
  // ReplicaCopyStart's request for CopyReplica and CheckCopyReplica.
  static v1::ReplicaCopyStartRequest CopyRequest(absl::string_view key,
                                                 absl::Span<const std::string> targets,
                                                 absl::string_view move_from);

  // Replica indices of `result`, those on this host first.
  std::vector<int> ReplicaOrder(const v1::GetResult& result);

  const ClientOptions options;
  const std::string local_host;
  const std::string machine_id;
  client::MasterClient master;
  std::unique_ptr<client::RoutingTransport> transport;

  // Segments on this machine: endpoint -> shared-memory socket ("" if it offers none).
  absl::Mutex shm_mu;
  absl::flat_hash_map<std::string, std::string> local_segments ABSL_GUARDED_BY(shm_mu);
  absl::flat_hash_set<std::string> remote_segments ABSL_GUARDED_BY(shm_mu);
  absl::Time segments_fetched ABSL_GUARDED_BY(shm_mu) = absl::InfinitePast();

  // Checksums of many values (XXH3 runs at ~10 GB/s per core: large batches use several).
  std::vector<uint64_t> Checksums(const std::vector<std::vector<iovec>>& values);
  TaskPool workers{static_cast<int>(std::clamp(std::thread::hardware_concurrency() / 2, 1u, 8u)) - 1};

  // Locations within their lease, by key (see Located). Bounded: cleared when full.
  static constexpr size_t kMaxCachedLocations = size_t{1} << 16;
  static constexpr absl::Duration kCacheMargin = absl::Seconds(2);
  static constexpr absl::Duration kFallbackMargin = absl::Milliseconds(500);
  static constexpr absl::Duration kRenewTimeout = absl::Milliseconds(500);
  absl::Mutex cache_mu;
  absl::flat_hash_map<std::string, Located> locations ABSL_GUARDED_BY(cache_mu);

  // Metrics (ClientMetrics, MetricsText): whole calls, and the bytes of the keys that made it.
  LatencyHistogram put_latency;
  LatencyHistogram get_latency;
  // A put's phases (kvpool_client_put_phase_seconds{phase}), to tell where a slow put spent
  // its time: mapping local pools, BatchPutStart, moving the bytes, waiting for the
  // checksums after that, BatchPutEnd (durable commit, retries included).
  enum PutPhase { kMapPools, kReserve, kWrite, kChecksumWait, kCommit, kPutPhases };
  static constexpr const char* kPutPhaseNames[kPutPhases] = {"map_pools", "reserve", "write",
                                                             "checksum_wait", "commit"};
  std::array<LatencyHistogram, kPutPhases> put_phases;
  std::atomic<uint64_t> bytes_put{0};
  std::atomic<uint64_t> bytes_got{0};
  std::atomic<uint64_t> location_cache_hits{0};
};

std::vector<uint64_t> Client::Impl::Checksums(const std::vector<std::vector<iovec>>& values) {
  std::vector<uint64_t> sums(values.size());
  uint64_t total = 0;
  for (const auto& value : values) {
    for (const iovec& part : value) total += part.iov_len;
  }
  int tasks = total < (uint64_t{16} << 20) ? 1 : workers.size() + 1;
  std::vector<std::function<void()>> work;
  for (int t = 0; t < tasks; ++t) {
    work.push_back([&, t] {
      for (size_t i = t; i < values.size(); i += tasks) sums[i] = wire::Checksum(values[i]);
    });
  }
  workers.Run(std::move(work));
  return sums;
}

void Client::Impl::MapKnownLocalPools() {
  if (options.transport != TransportKind::kAuto &&
      options.transport != TransportKind::kSharedMemory) {
    return;
  }
  std::vector<std::string> endpoints;
  {
    absl::MutexLock lock(&shm_mu);
    for (const auto& [endpoint, socket] : local_segments) {
      if (!socket.empty()) endpoints.push_back(endpoint);
    }
  }
  // Mapped already: a lookup each. Refused or failed: not asked again for a while.
  for (const std::string& endpoint : endpoints) transport->LocalPool(endpoint, /*incarnation=*/0);
}

std::optional<std::string> Client::Impl::ShmSocketOf(const std::string& endpoint) {
  absl::MutexLock lock(&shm_mu);
  bool known = local_segments.contains(endpoint) || remote_segments.contains(endpoint);
  if (!known && absl::Now() - segments_fetched > absl::Seconds(1)) {
    segments_fetched = absl::Now();
    if (absl::StatusOr<v1::GetClusterStatusResponse> status =
            master.GetClusterStatus(v1::GetClusterStatusRequest());
        status.ok()) {
      local_segments.clear();
      remote_segments.clear();
      for (const v1::SegmentStatus& segment : status->segments()) {
        if (segment.machine_id() == machine_id) {
          local_segments[segment.endpoint()] = segment.shm_socket();
        } else {
          remote_segments.insert(segment.endpoint());
        }
      }
    }
  }
  auto it = local_segments.find(endpoint);
  if (it == local_segments.end() || it->second.empty()) return std::nullopt;
  return it->second;
}

std::vector<prometheus::MetricFamily> ClientMetrics::Collect() const {
  const Client::Impl& impl = *client_.impl_;
  MetricFamilies families;
  families.Histogram("kvpool_client_put_duration_seconds", "Time of a client's put calls.",
                     impl.put_latency.Snapshot());
  families.Histogram("kvpool_client_get_duration_seconds", "Time of a client's get calls.",
                     impl.get_latency.Snapshot());
  for (int phase = 0; phase < Client::Impl::kPutPhases; ++phase) {
    families.Histogram("kvpool_client_put_phase_seconds",
                       "Time of each phase of a client's put calls.",
                       impl.put_phases[phase].Snapshot(),
                       {{"phase", Client::Impl::kPutPhaseNames[phase]}});
  }
  families.Counter("kvpool_client_bytes_total", "Bytes a client stored and read.",
                   static_cast<double>(impl.bytes_put.load()), {{"op", "put"}});
  families.Counter("kvpool_client_bytes_total", "Bytes a client stored and read.",
                   static_cast<double>(impl.bytes_got.load()), {{"op", "get"}});
  client::RoutingTransport::Stats transport = impl.transport->stats();
  families.Counter("kvpool_client_transfers_total", "Replica transfers, by transport.",
                   static_cast<double>(transport.shm_ops), {{"transport", "shm"}});
  families.Counter("kvpool_client_transfers_total", "Replica transfers, by transport.",
                   static_cast<double>(transport.rdma_ops), {{"transport", "rdma"}});
  families.Counter("kvpool_client_transfers_total", "Replica transfers, by transport.",
                   static_cast<double>(transport.tcp_ops), {{"transport", "tcp"}});
  families.Counter("kvpool_client_location_cache_hits_total",
                   "Keys located from the client's lease cache instead of the master.",
                   static_cast<double>(impl.location_cache_hits.load()));
  return families.Take();
}

std::string Client::MetricsText() const { return SerializeMetrics(ClientMetrics(*this).Collect()); }

std::vector<int> Client::Impl::ReplicaOrder(const v1::GetResult& result) {
  std::vector<int> order(result.replicas_size());
  std::iota(order.begin(), order.end(), 0);
  if (order.size() > 1) {
    std::stable_partition(order.begin(), order.end(), [&](int i) {
      const v1::Placement& replica = result.replicas(i);
      return replica.host() == local_host || ShmSocketOf(replica.endpoint()).has_value();
    });
  }
  return order;
}

absl::StatusOr<std::vector<Client::Impl::Located>> Client::Impl::Locate(
    absl::Span<const std::string> keys) {
  MapKnownLocalPools();
  std::vector<Located> located(keys.size());
  std::vector<size_t> missing;
  // Cached locations being asked for again, by their position in `missing`.
  absl::flat_hash_map<size_t, Located> renewing;
  absl::Time now = absl::Now();
  {
    absl::MutexLock lock(&cache_mu);
    for (size_t i = 0; i < keys.size(); ++i) {
      auto it = options.cache_locations ? locations.find(keys[i]) : locations.end();
      absl::Duration margin =
          it == locations.end()
              ? kCacheMargin
              : std::max(kCacheMargin, absl::Milliseconds(it->second.result.lease_ttl_ms()) / 2);
      if (it != locations.end() && it->second.lease_expiry - margin > now) {
        located[i] = it->second;
        location_cache_hits.fetch_add(1, std::memory_order_relaxed);
      } else {
        if (it != locations.end() && it->second.lease_expiry - kFallbackMargin > now) {
          renewing.emplace(missing.size(), it->second);
        }
        located[i].key = keys[i];
        missing.push_back(i);
      }
    }
  }
  if (missing.empty()) return located;
  v1::BatchGetReplicaListRequest request;
  for (size_t i : missing) request.add_keys(keys[i]);
  absl::StatusOr<v1::BatchGetReplicaListResponse> answer = master.BatchGetReplicaList(
      request, renewing.size() == missing.size() ? std::optional(kRenewTimeout) : std::nullopt);
  if (answer.ok() && answer->results_size() != static_cast<int>(missing.size())) {
    answer = CountMismatch(answer->results_size(), missing.size());
  }
  if (!answer.ok()) {
    if (renewing.size() != missing.size()) return answer.status();
    // Every key still has a lease: read where the cache says.
    for (auto& [k, entry] : renewing) located[missing[k]] = std::move(entry);
    return located;
  }
  absl::MutexLock lock(&cache_mu);
  if (locations.size() > kMaxCachedLocations) locations.clear();
  for (size_t k = 0; k < missing.size(); ++k) {
    Located& entry = located[missing[k]];
    if (auto old = renewing.find(k); old != renewing.end() &&
                                      answer->results(static_cast<int>(k)).code() ==
                                          v1::OBJECT_NOT_FOUND) {
      entry = std::move(old->second);
      continue;
    }
    entry.result = std::move(*answer->mutable_results(static_cast<int>(k)));
    entry.lease_expiry = now + absl::Milliseconds(entry.result.lease_ttl_ms());
    if (options.cache_locations && entry.result.code() == v1::OK) {
      Located& cached = locations[entry.key];
      cached = entry;
      cached.cached = true;
    }
  }
  return located;
}

void Client::Impl::ForgetLocations(absl::Span<const std::string> keys) {
  absl::MutexLock lock(&cache_mu);
  for (const std::string& key : keys) locations.erase(key);
}

void Client::Impl::ReadLocated(const std::vector<Located>& located, std::vector<size_t> wanted,
                               const std::vector<std::vector<iovec>>& targets,
                               const GetOptions& get_options,
                               std::vector<absl::StatusOr<uint64_t>>& results) {
  std::vector<std::vector<int>> order(results.size());
  std::vector<size_t> tried(results.size(), 0);
  for (size_t i : wanted) order[i] = ReplicaOrder(located[i].result);
  std::vector<size_t> waiting = std::move(wanted);
  std::vector<std::string> stale;
  absl::Time deadline = TransferDeadline();
  while (!waiting.empty()) {
    std::vector<TransferOp> ops;
    std::vector<size_t> owners;
    for (size_t i : waiting) {
      const v1::GetResult& result = located[i].result;
      const v1::Placement& replica = result.replicas(order[i][tried[i]++]);
      absl::StatusOr<TransferOp> op = MakeOp(wire::Opcode::kRead, replica, result.size(), targets[i]);
      if (!op.ok()) {
        results[i] = op.status();
        continue;
      }
      ops.push_back(*std::move(op));
      owners.push_back(i);
    }
    transport->Execute(absl::MakeSpan(ops), deadline);
    waiting.clear();
    absl::Time finished = absl::Now();
    // The values to check, hashed together (on several threads for a large batch).
    std::vector<bool> check(ops.size(), false);
    std::vector<std::vector<iovec>> to_hash;
    std::vector<size_t> hashed_as(ops.size(), 0);
    for (size_t k = 0; k < ops.size(); ++k) {
      size_t i = owners[k];
      bool lease_ran_out = finished > located[i].lease_expiry;
      check[k] = ops[k].status.ok() &&
                 (get_options.verify_checksum || options.verify_checksums || lease_ran_out ||
                  located[i].cached) &&
                 located[i].result.checksum() != 0;
      if (check[k]) {
        hashed_as[k] = to_hash.size();
        to_hash.push_back(targets[i]);
      }
    }
    std::vector<uint64_t> sums = to_hash.empty() ? std::vector<uint64_t>() : Checksums(to_hash);
    for (size_t k = 0; k < ops.size(); ++k) {
      size_t i = owners[k];
      const v1::GetResult& result = located[i].result;
      if (ops[k].status.ok()) {
        bool lease_ran_out = finished > located[i].lease_expiry;
        if (check[k] && sums[hashed_as[k]] != result.checksum()) {
          results[i] = lease_ran_out
                           ? ErrorStatus(v1::LEASE_EXPIRED,
                                         "the read outlasted its lease and the object changed")
                           : ErrorStatus(v1::CHECKSUM_MISMATCH,
                                         absl::StrCat("bytes read from ", ops[k].endpoint,
                                                      " do not match the writer's checksum"));
        } else {
          results[i] = result.size();
        }
      } else if (tried[i] < order[i].size() &&
                 ops[k].status.code() != absl::StatusCode::kDeadlineExceeded &&
                 ToErrorCode(ops[k].status) != v1::LEASE_EXPIRED) {
        waiting.push_back(i);  // try the next replica
      } else {
        results[i] = ops[k].status;
      }
      if (!results[i].ok() && located[i].cached) {
        // The answer is old (the object was force-removed, its segment lost or drained):
        // forget it and let the caller's LEASE_EXPIRED retry ask the master afresh.
        stale.push_back(located[i].key);
        results[i] = ErrorStatus(v1::LEASE_EXPIRED,
                                 absl::StrCat("cached location failed: ", results[i].status().message()));
      }
    }
  }
  if (!stale.empty()) ForgetLocations(stale);
}

std::vector<absl::StatusOr<uint64_t>> Client::Impl::BatchGetOnce(absl::Span<const GetItem> items,
                                                               const GetOptions& options) {
  const size_t n = items.size();
  std::vector<absl::StatusOr<uint64_t>> results(n, uint64_t{0});
  if (n == 0) return results;
  // Step G1: where the replicas are.
  std::vector<std::string> keys;
  keys.reserve(n);
  for (const GetItem& item : items) keys.push_back(item.key);
  absl::StatusOr<std::vector<Located>> located = Locate(keys);
  if (!located.ok()) return std::vector<absl::StatusOr<uint64_t>>(n, located.status());

  std::vector<std::vector<iovec>> targets(n);
  std::vector<size_t> wanted;
  for (size_t i = 0; i < n; ++i) {
    const v1::GetResult& result = (*located)[i].result;
    if (result.code() != v1::OK) {
      results[i] = FromErrorCode(result.code(), result.message());
      continue;
    }
    if (result.replicas().empty()) {
      results[i] = absl::InternalError("master gave no replica");
      continue;
    }
    uint64_t capacity = 0;
    for (const MutableBuffer& part : items[i].parts) capacity += part.size;
    if (capacity < result.size()) {
      results[i] = ErrorStatus(v1::BUFFER_OVERFLOW,
                               absl::StrCat("buffers hold ", capacity, " bytes but the object has ",
                                            result.size()));
      continue;
    }
    targets[i] = Truncated(items[i].parts, result.size());
    wanted.push_back(i);
  }
  ReadLocated(*located, std::move(wanted), targets, options, results);
  return results;
}

Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Client::~Client() = default;

absl::StatusOr<std::unique_ptr<Client>> Client::Create(const ClientOptions& options) {
  if (absl::Status tls = ValidateClientTls(TlsOptionsOf(options)); !tls.ok()) return tls;
  absl::StatusOr<std::unique_ptr<MasterLocator>> locator =
      MasterLocator::Create(options.master_address, kDefaultEtcdPrefix, TlsOptionsOf(options));
  if (!locator.ok()) return locator.status();
  auto impl = std::make_unique<Impl>(options, std::move(*locator));
  if (absl::Status ready = impl->master.WaitForMaster(options.connect_timeout); !ready.ok()) {
    return ready;
  }
  // The segments known now, so that the first writes and reads do not ask the master for
  // them between a placement and its bytes (a write held up there lands late, and shared
  // memory writes are not fenced at the segment: docs/semantics.md).
  impl->ShmSocketOf("");
  return std::unique_ptr<Client>(new Client(std::move(impl)));
}

absl::Status Client::Put(absl::string_view key, absl::Span<const ConstBuffer> parts,
                         const PutOptions& options) {
  PutItem item{std::string(key), std::vector<ConstBuffer>(parts.begin(), parts.end())};
  return BatchPut(absl::MakeConstSpan(&item, 1), options)[0];
}

absl::Status Client::Put(absl::string_view key, absl::string_view value, const PutOptions& options) {
  ConstBuffer part{value.data(), value.size()};
  return Put(key, absl::MakeConstSpan(&part, 1), options);
}

std::vector<absl::Status> Client::BatchPut(absl::Span<const PutItem> items,
                                           const PutOptions& options) {
  absl::Time started = absl::Now();
  std::vector<absl::Status> results = impl_->BatchPutOnce(items, options);
  impl_->put_latency.Observe(absl::Now() - started);
  uint64_t bytes = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    if (!results[i].ok()) continue;
    for (const ConstBuffer& part : items[i].parts) bytes += part.size;
  }
  impl_->bytes_put.fetch_add(bytes, std::memory_order_relaxed);
  return results;
}

std::vector<absl::Status> Client::Impl::BatchPutOnce(absl::Span<const PutItem> items,
                                                     const PutOptions& options) {
  const size_t n = items.size();
  std::vector<absl::Status> results(n);
  if (n == 0) return results;
  // Pools of this machine's segments are mapped before any space is reserved: mapping (and
  // populating) a large pool can take longer than a reservation lasts, and a write whose
  // token expired meanwhile is refused (its intent would be LEASE_EXPIRED).
  absl::Time phase_start = absl::Now();
  auto phase_done = [&](PutPhase phase) {
    absl::Time now = absl::Now();
    put_phases[phase].Observe(now - phase_start);
    phase_start = now;
  };
  MapKnownLocalPools();
  phase_done(kMapPools);

  // Step P1: reserve space.
  v1::BatchPutStartRequest start;
  start.set_replica_num(options.replicas);
  start.set_pin(options.pin == PinMode::kHard   ? v1::PIN_HARD
                : options.pin == PinMode::kSoft ? v1::PIN_SOFT
                                                : v1::PIN_NONE);
  if (options.prefer_local_segment) {
    start.set_preferred_host(local_host);
    start.set_preferred_machine_id(machine_id);
  }
  for (const std::string& segment : options.preferred_segments) {
    start.add_preferred_segments(segment);
  }
  for (const PutItem& item : items) {
    start.add_keys(item.key);
    start.add_sizes(std::accumulate(item.parts.begin(), item.parts.end(), uint64_t{0},
                                    [](uint64_t sum, const ConstBuffer& b) { return sum + b.size; }));
  }
  absl::StatusOr<v1::BatchPutStartResponse> reserved = master.BatchPutStart(start);
  phase_done(kReserve);
  if (reserved.ok() && reserved->results_size() != static_cast<int>(n)) {
    reserved = CountMismatch(reserved->results_size(), n);
  }
  if (!reserved.ok()) return std::vector<absl::Status>(n, reserved.status());

  // Step P2: write every replica straight from the caller's buffers.
  std::vector<TransferOp> ops;
  std::vector<size_t> owners;
  std::vector<bool> has_reservation(n, false);
  std::vector<std::vector<iovec>> gathered(n);
  for (size_t i = 0; i < n; ++i) {
    const v1::PutStartResult& result = reserved->results(static_cast<int>(i));
    if (result.code() != v1::OK) {
      results[i] = FromErrorCode(result.code(), result.message());
      continue;
    }
    has_reservation[i] = true;
    std::vector<iovec>& iov = gathered[i];
    for (const ConstBuffer& part : items[i].parts) {
      if (part.size > 0) iov.push_back(iovec{const_cast<void*>(part.data), part.size});
    }
    if (result.placements().empty()) results[i] = absl::InternalError("master gave no placement");
    for (const v1::Placement& placement : result.placements()) {
      absl::StatusOr<TransferOp> op =
          MakeOp(wire::Opcode::kWrite, placement, start.sizes(static_cast<int>(i)), iov);
      if (!op.ok()) {
        results[i] = op.status();
        break;
      }
      ops.push_back(*std::move(op));
      owners.push_back(i);
    }
  }
  // The checksums are computed while the bytes move.
  std::vector<uint64_t> checksums;
  std::thread summing([&] { checksums = Checksums(gathered); });
  transport->Execute(absl::MakeSpan(ops), TransferDeadline());
  phase_done(kWrite);
  summing.join();
  phase_done(kChecksumWait);
  for (size_t k = 0; k < ops.size(); ++k) {
    if (!ops[k].status.ok() && results[owners[k]].ok()) results[owners[k]] = ops[k].status;
  }

  // Step P3: commit what was written; revoke what was not, so its space is freed at once.
  v1::BatchPutEndRequest end;
  v1::BatchPutRevokeRequest revoke;
  std::vector<size_t> committed;
  for (size_t i = 0; i < n; ++i) {
    if (!has_reservation[i]) continue;
    v1::PutEndItem* item = results[i].ok() ? end.add_items() : revoke.add_items();
    item->set_key(items[i].key);
    item->set_put_id(reserved->results(static_cast<int>(i)).put_id());
    if (results[i].ok()) item->set_checksum(checksums[i]);
    if (results[i].ok()) committed.push_back(i);
  }
  // A commit the master could not make durable on every replica's segment in time is
  // WRITE_FAIL; committing again with the same put_id is safe, so it is retried a few times
  // (each waits up to the master's manifest sync timeout) before the caller hears of it.
  constexpr int kCommitAttempts = 3;
  for (int attempt = 0; attempt < kCommitAttempts && !committed.empty(); ++attempt) {
    absl::StatusOr<v1::BatchPutEndResponse> ended = master.BatchPutEnd(end);
    if (ended.ok() && ended->results_size() != static_cast<int>(committed.size())) {
      ended = CountMismatch(ended->results_size(), committed.size());
    }
    v1::BatchPutEndRequest retry;
    std::vector<size_t> again;
    for (size_t k = 0; k < committed.size(); ++k) {
      absl::Status answer = ended.ok()
                                ? FromErrorCode(ended->results(static_cast<int>(k)).code(),
                                                ended->results(static_cast<int>(k)).message())
                                : ended.status();
      // A retried commit whose object went away meanwhile (its segment declared dead) was
      // never durable: it stays WRITE_FAIL (put again), not a miss.
      if (attempt == 0 || ToErrorCode(answer) != v1::OBJECT_NOT_FOUND) {
        results[committed[k]] = answer;
      }
      if (ended.ok() && ended->results(static_cast<int>(k)).code() == v1::WRITE_FAIL) {
        *retry.add_items() = end.items(static_cast<int>(k));
        again.push_back(committed[k]);
      }
    }
    end = std::move(retry);
    committed = std::move(again);
  }
  phase_done(kCommit);
  if (revoke.items_size() > 0) {
    // Best effort: a reservation that is not revoked expires on the master by itself.
    (void)master.BatchPutRevoke(revoke);
  }
  return results;
}

absl::StatusOr<uint64_t> Client::Get(absl::string_view key, absl::Span<const MutableBuffer> parts,
                                     const GetOptions& options) {
  GetItem item{std::string(key), std::vector<MutableBuffer>(parts.begin(), parts.end())};
  return BatchGet(absl::MakeConstSpan(&item, 1), options)[0];
}

absl::StatusOr<std::string> Client::Get(absl::string_view key, const GetOptions& options) {
  absl::Time started = absl::Now();
  absl::StatusOr<std::string> value = impl_->GetValue(key, options);
  impl_->get_latency.Observe(absl::Now() - started);
  if (value.ok()) impl_->bytes_got.fetch_add(value->size(), std::memory_order_relaxed);
  return value;
}

absl::StatusOr<std::string> Client::Impl::GetValue(absl::string_view key,
                                                   const GetOptions& options) {
  // The size is known only once the master answers: ask, allocate, then read. A read that
  // lost its lease (LEASE_EXPIRED) is retried once with a fresh answer.
  absl::Status status;
  std::string k(key);
  for (int attempt = 0; attempt < 2; ++attempt) {
    absl::StatusOr<std::vector<Located>> located = Locate(absl::MakeConstSpan(&k, 1));
    if (!located.ok()) return located.status();
    const v1::GetResult& result = (*located)[0].result;
    if (result.code() != v1::OK) return FromErrorCode(result.code(), result.message());
    if (result.replicas().empty()) return absl::InternalError("master gave no replica");
    // What the master says is checked before it sizes an allocation: a bad answer is an
    // error, never an abort (or an attempt to allocate petabytes).
    constexpr uint64_t kMaxValueBytes = uint64_t{64} << 30;
    for (const v1::Placement& replica : result.replicas()) {
      if (replica.length() != result.size()) {
        return absl::InternalError(absl::StrCat("master placed ", replica.length(),
                                                " bytes for an object of ", result.size()));
      }
    }
    if (result.size() == 0 || result.size() > kMaxValueBytes) {
      return absl::InternalError(
          absl::StrCat("master answered a size of ", result.size(), " bytes for \"", key,
                       "\" (want 1 to ", kMaxValueBytes, "; use the buffer variant of Get)"));
    }
    std::string value(result.size(), '\0');
    std::vector<std::vector<iovec>> targets = {{iovec{value.data(), value.size()}}};
    std::vector<absl::StatusOr<uint64_t>> results(1);
    ReadLocated(*located, {0}, targets, options, results);
    if (results[0].ok()) return value;
    status = results[0].status();
    if (ToErrorCode(status) != v1::LEASE_EXPIRED) break;
  }
  return status;
}

std::vector<absl::StatusOr<uint64_t>> Client::BatchGet(absl::Span<const GetItem> items,
                                                       const GetOptions& options) {
  absl::Time started = absl::Now();
  std::vector<absl::StatusOr<uint64_t>> results = impl_->BatchGetOnce(items, options);
  // Reads that lost their lease get one more try with a fresh answer from the master.
  std::vector<size_t> expired;
  for (size_t i = 0; i < results.size(); ++i) {
    if (!results[i].ok() && ToErrorCode(results[i].status()) == v1::LEASE_EXPIRED) {
      expired.push_back(i);
    }
  }
  if (!expired.empty()) {
    std::vector<GetItem> again;
    for (size_t i : expired) again.push_back(items[i]);
    std::vector<absl::StatusOr<uint64_t>> retried = impl_->BatchGetOnce(again, options);
    for (size_t k = 0; k < expired.size(); ++k) results[expired[k]] = std::move(retried[k]);
  }
  impl_->get_latency.Observe(absl::Now() - started);
  uint64_t bytes = 0;
  for (const absl::StatusOr<uint64_t>& result : results) bytes += result.value_or(0);
  impl_->bytes_got.fetch_add(bytes, std::memory_order_relaxed);
  return results;
}

absl::StatusOr<uint64_t> Client::Size(absl::string_view key) {
  v1::BatchGetReplicaListRequest request;
  request.add_keys(std::string(key));
  absl::StatusOr<v1::BatchGetReplicaListResponse> located =
      impl_->master.BatchGetReplicaList(request);
  if (!located.ok()) return located.status();
  if (located->results_size() != 1) return CountMismatch(located->results_size(), 1);
  const v1::GetResult& result = located->results(0);
  if (result.code() != v1::OK) return FromErrorCode(result.code(), result.message());
  return result.size();
}

absl::StatusOr<bool> Client::Exists(absl::string_view key) {
  std::string k(key);
  return BatchExist(absl::MakeConstSpan(&k, 1))[0];
}

std::vector<absl::StatusOr<bool>> Client::BatchExist(absl::Span<const std::string> keys) {
  v1::BatchExistRequest request;
  for (const std::string& key : keys) request.add_keys(key);
  absl::StatusOr<v1::BatchExistResponse> response = impl_->master.BatchExist(request);
  if (response.ok() && response->results_size() != static_cast<int>(keys.size())) {
    response = CountMismatch(response->results_size(), keys.size());
  }
  if (!response.ok()) return std::vector<absl::StatusOr<bool>>(keys.size(), response.status());
  std::vector<absl::StatusOr<bool>> results;
  results.reserve(keys.size());
  for (const v1::ExistResult& result : response->results()) {
    if (result.code() == v1::OK) {
      results.push_back(result.exists());
    } else {
      results.push_back(FromErrorCode(result.code(), ""));
    }
  }
  return results;
}

absl::Status Client::Remove(absl::string_view key, bool force) {
  std::string k(key);
  return BatchRemove(absl::MakeConstSpan(&k, 1), force)[0];
}

std::vector<absl::Status> Client::BatchRemove(absl::Span<const std::string> keys, bool force) {
  impl_->ForgetLocations(keys);
  v1::BatchRemoveRequest request;
  request.set_force(force);
  for (const std::string& key : keys) request.add_keys(key);
  absl::StatusOr<v1::BatchRemoveResponse> response = impl_->master.BatchRemove(request);
  return KeyStatuses(response, keys.size());
}

std::vector<absl::Status> Client::BatchDropReplicas(absl::Span<const std::string> keys,
                                                    absl::string_view segment, bool force) {
  impl_->ForgetLocations(keys);
  v1::BatchDropReplicasRequest request;
  request.set_segment(std::string(segment));
  request.set_force(force);
  for (const std::string& key : keys) request.add_keys(key);
  absl::StatusOr<v1::BatchDropReplicasResponse> response =
      impl_->master.BatchDropReplicas(request);
  return KeyStatuses(response, keys.size());
}

absl::StatusOr<uint64_t> Client::RemoveAll(bool force) {
  {
    absl::MutexLock lock(&impl_->cache_mu);
    impl_->locations.clear();
  }
  v1::RemoveAllRequest request;
  request.set_force(force);
  absl::StatusOr<v1::RemoveAllResponse> response = impl_->master.RemoveAll(request);
  if (!response.ok()) return response.status();
  return response->removed();
}

absl::StatusOr<uint64_t> Client::RemoveByRegex(absl::string_view pattern, bool force) {
  if (pattern.empty()) return absl::InvalidArgumentError("remove by regex: the pattern is empty");
  {
    absl::MutexLock lock(&impl_->cache_mu);
    impl_->locations.clear();
  }
  v1::RemoveAllRequest request;
  request.set_force(force);
  request.set_key_regex(std::string(pattern));
  absl::StatusOr<v1::RemoveAllResponse> response = impl_->master.RemoveAll(request);
  if (!response.ok()) return response.status();
  return response->removed();
}

std::vector<absl::StatusOr<std::vector<ReplicaLocation>>> Client::BatchReplicaLocations(
    absl::Span<const std::string> keys) {
  v1::BatchGetReplicaListRequest request;
  for (const std::string& key : keys) request.add_keys(key);
  absl::StatusOr<v1::BatchGetReplicaListResponse> located =
      impl_->master.BatchGetReplicaList(request);
  if (located.ok() && located->results_size() != static_cast<int>(keys.size())) {
    located = CountMismatch(located->results_size(), keys.size());
  }
  std::vector<absl::StatusOr<std::vector<ReplicaLocation>>> results;
  results.reserve(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    if (!located.ok()) {
      results.push_back(located.status());
      continue;
    }
    const v1::GetResult& result = located->results(static_cast<int>(i));
    if (result.code() != v1::OK) {
      results.push_back(FromErrorCode(result.code(), result.message()));
      continue;
    }
    std::vector<ReplicaLocation> replicas;
    for (const v1::Placement& p : result.replicas()) {
      replicas.push_back(ReplicaLocation{p.segment_name(), p.endpoint(), p.offset(), p.length()});
    }
    results.push_back(std::move(replicas));
  }
  return results;
}

absl::StatusOr<ClusterStatus> Client::GetClusterStatus() {
  absl::StatusOr<v1::GetClusterStatusResponse> response =
      impl_->master.GetClusterStatus(v1::GetClusterStatusRequest());
  if (!response.ok()) return response.status();
  ClusterStatus status;
  status.capacity_bytes = response->capacity_bytes();
  status.used_bytes = response->used_bytes();
  status.objects = response->objects();
  status.pending_objects = response->pending_objects();
  status.leased_objects = response->leased_objects();
  status.soft_pinned_objects = response->soft_pinned_objects();
  status.hard_pinned_objects = response->hard_pinned_objects();
  status.evicted_objects = response->evicted_objects();
  status.evicted_bytes = response->evicted_bytes();
  status.reclaimed_reservations = response->reclaimed_reservations();
  status.get_hits = response->get_hits();
  status.get_misses = response->get_misses();
  status.put_deduplicated = response->put_deduplicated();
  status.put_no_space = response->put_no_space();
  status.role = response->role().empty() ? "single" : response->role();
  status.term = response->term();
  status.leader = response->leader();
  status.masters.assign(response->masters().begin(), response->masters().end());
  status.answered_by = response->self();
  for (const v1::SegmentStatus& s : response->segments()) {
    status.segments.push_back(SegmentStatus{
        .name = s.name(),
        .host = s.host(),
        .endpoint = s.endpoint(),
        .capacity_bytes = s.capacity_bytes(),
        .used_bytes = s.used_bytes(),
        .replicas = s.replicas(),
        .state = s.state(),
        .last_heartbeat_age = absl::Milliseconds(s.last_heartbeat_age_ms()),
    });
  }
  return status;
}

std::vector<absl::StatusOr<LocalValue>> Client::BatchGetLocal(absl::Span<const std::string> keys,
                                                              absl::Time* lease_expiry) {
  impl_->MapKnownLocalPools();
  const size_t n = keys.size();
  v1::BatchGetReplicaListRequest request;
  for (const std::string& key : keys) request.add_keys(key);
  absl::Time asked = absl::Now();
  absl::StatusOr<v1::BatchGetReplicaListResponse> located =
      impl_->master.BatchGetReplicaList(request);
  if (located.ok() && located->results_size() != static_cast<int>(n)) {
    located = CountMismatch(located->results_size(), n);
  }
  if (!located.ok()) return std::vector<absl::StatusOr<LocalValue>>(n, located.status());
  std::vector<absl::StatusOr<LocalValue>> results;
  results.reserve(n);
  absl::Time expiry = absl::InfiniteFuture();
  for (const v1::GetResult& result : located->results()) {
    if (result.code() != v1::OK) {
      results.push_back(FromErrorCode(result.code(), result.message()));
      continue;
    }
    expiry = std::min(expiry, asked + absl::Milliseconds(result.lease_ttl_ms()));
    absl::StatusOr<LocalValue> value =
        absl::FailedPreconditionError("no replica on a segment this process can map");
    for (const v1::Placement& replica : result.replicas()) {
      std::shared_ptr<const client::ShmTransport::Pool> pool =
          impl_->transport->LocalPool(replica.endpoint(), replica.incarnation());
      if (pool == nullptr || replica.offset() + replica.length() > pool->size) continue;
      value = LocalValue{pool->base + replica.offset(), replica.length(), result.checksum()};
      break;
    }
    results.push_back(std::move(value));
  }
  if (lease_expiry != nullptr) *lease_expiry = expiry;
  return results;
}

std::vector<absl::StatusOr<LocalReservation>> Client::BatchReserveLocal(
    absl::Span<const std::string> keys, absl::Span<const uint64_t> sizes,
    const PutOptions& options) {
  impl_->MapKnownLocalPools();
  const size_t n = keys.size();
  if (sizes.size() != n) {
    return std::vector<absl::StatusOr<LocalReservation>>(
        n, absl::InvalidArgumentError("keys and sizes differ in number"));
  }
  v1::BatchPutStartRequest start;
  start.set_replica_num(1);
  start.set_pin(options.pin == PinMode::kHard   ? v1::PIN_HARD
                : options.pin == PinMode::kSoft ? v1::PIN_SOFT
                                                : v1::PIN_NONE);
  start.set_preferred_host(impl_->local_host);
  start.set_preferred_machine_id(impl_->machine_id);
  for (size_t i = 0; i < n; ++i) {
    start.add_keys(keys[i]);
    start.add_sizes(sizes[i]);
  }
  absl::StatusOr<v1::BatchPutStartResponse> reserved = impl_->master.BatchPutStart(start);
  if (reserved.ok() && reserved->results_size() != static_cast<int>(n)) {
    reserved = CountMismatch(reserved->results_size(), n);
  }
  if (!reserved.ok()) return std::vector<absl::StatusOr<LocalReservation>>(n, reserved.status());
  std::vector<absl::StatusOr<LocalReservation>> results;
  v1::BatchPutRevokeRequest revoke;
  // The write intents to ask for, by pool.
  struct PoolIntents {
    std::string endpoint;
    std::shared_ptr<const client::ShmTransport::Pool> pool;
    std::vector<size_t> index;  // into results
    std::vector<wire::ShmIntent> intents;
  };
  std::vector<PoolIntents> intents;
  for (size_t i = 0; i < n; ++i) {
    const v1::PutStartResult& result = reserved->results(static_cast<int>(i));
    if (result.code() != v1::OK) {
      results.push_back(FromErrorCode(result.code(), result.message()));
      continue;
    }
    const v1::Placement& placement = result.placements(0);
    std::shared_ptr<const client::ShmTransport::Pool> pool =
        impl_->transport->LocalPool(placement.endpoint(), placement.incarnation());
    if (pool == nullptr || placement.offset() + placement.length() > pool->size) {
      v1::PutEndItem* item = revoke.add_items();
      item->set_key(keys[i]);
      item->set_put_id(result.put_id());
      results.push_back(absl::FailedPreconditionError(
          "no segment this process can map had room; use BatchPut"));
      continue;
    }
    uint64_t expiry_ms = 0;
    std::memcpy(&expiry_ms, placement.token().data(),
                std::min<size_t>(sizeof(expiry_ms), placement.token().size()));
    results.push_back(LocalReservation{keys[i], pool->base + placement.offset(),
                                       placement.length(), result.put_id(),
                                       absl::FromUnixMillis(static_cast<int64_t>(expiry_ms)),
                                       /*checksum=*/std::nullopt, placement.endpoint()});
    wire::ShmIntent intent{placement.offset(), placement.length()};
    std::memcpy(intent.token.data(), placement.token().data(),
                std::min(intent.token.size(), placement.token().size()));
    auto it = std::find_if(intents.begin(), intents.end(),
                           [&](const auto& entry) { return entry.pool == pool; });
    if (it == intents.end()) it = intents.insert(intents.end(), {placement.endpoint(), pool});
    it->index.push_back(results.size() - 1);
    it->intents.push_back(intent);
  }
  // The caller writes straight into the pool: the segment accepts each write first (its
  // write intent), as it would check a TCP write's token.
  for (const PoolIntents& pool : intents) {
    std::vector<absl::StatusOr<uint64_t>> begun =
        impl_->transport->BeginLocalWrites(pool.endpoint, pool.pool, pool.intents);
    for (size_t k = 0; k < pool.index.size(); ++k) {
      absl::StatusOr<LocalReservation>& reservation = results[pool.index[k]];
      if (begun[k].ok()) {
        reservation->write_intent = *begun[k];
        continue;
      }
      v1::PutEndItem* item = revoke.add_items();
      item->set_key(reservation->key);
      item->set_put_id(reservation->put_id);
      reservation = begun[k].status();
    }
  }
  if (revoke.items_size() > 0) (void)impl_->master.BatchPutRevoke(revoke);
  return results;
}

void Client::EndLocalWrites(absl::Span<const LocalReservation> reservations) {
  absl::flat_hash_map<std::string, std::vector<uint64_t>> done;
  for (const LocalReservation& reservation : reservations) {
    if (reservation.write_intent != 0) {
      done[reservation.endpoint].push_back(reservation.write_intent);
    }
  }
  for (const auto& [endpoint, ids] : done) impl_->transport->EndLocalWrites(endpoint, ids);
}

std::vector<absl::Status> Client::BatchCommitLocal(absl::Span<const LocalReservation> reservations) {
  // The writes are done before the commit reaches the segment, so it finds them done.
  EndLocalWrites(reservations);
  std::vector<std::vector<iovec>> values;
  std::vector<size_t> hashed;  // reservations whose checksum the writer did not give
  for (size_t i = 0; i < reservations.size(); ++i) {
    if (reservations[i].checksum.has_value()) continue;
    hashed.push_back(i);
    values.push_back({iovec{reservations[i].data, reservations[i].size}});
  }
  std::vector<uint64_t> sums = values.empty() ? std::vector<uint64_t>() : impl_->Checksums(values);
  std::vector<uint64_t> checksums(reservations.size());
  for (size_t i = 0; i < reservations.size(); ++i) {
    if (reservations[i].checksum.has_value()) checksums[i] = *reservations[i].checksum;
  }
  for (size_t k = 0; k < hashed.size(); ++k) checksums[hashed[k]] = sums[k];
  v1::BatchPutEndRequest end;
  for (size_t i = 0; i < reservations.size(); ++i) {
    v1::PutEndItem* item = end.add_items();
    item->set_key(reservations[i].key);
    item->set_put_id(reservations[i].put_id);
    item->set_checksum(checksums[i]);
  }
  absl::StatusOr<v1::BatchPutEndResponse> ended = impl_->master.BatchPutEnd(end);
  if (ended.ok() && ended->results_size() != static_cast<int>(reservations.size())) {
    ended = CountMismatch(ended->results_size(), reservations.size());
  }
  if (!ended.ok()) return std::vector<absl::Status>(reservations.size(), ended.status());
  std::vector<absl::Status> results;
  uint64_t bytes = 0;
  for (size_t i = 0; i < reservations.size(); ++i) {
    const v1::KeyResult& result = ended->results(static_cast<int>(i));
    results.push_back(FromErrorCode(result.code(), result.message()));
    if (results.back().ok()) bytes += reservations[i].size;
  }
  impl_->bytes_put.fetch_add(bytes, std::memory_order_relaxed);
  return results;
}

void Client::BatchAbandonLocal(absl::Span<const LocalReservation> reservations) {
  EndLocalWrites(reservations);
  v1::BatchPutRevokeRequest revoke;
  for (const LocalReservation& reservation : reservations) {
    v1::PutEndItem* item = revoke.add_items();
    item->set_key(reservation.key);
    item->set_put_id(reservation.put_id);
  }
  (void)impl_->master.BatchPutRevoke(revoke);
}

std::vector<MappedPool> Client::MappedPools() {
  std::vector<MappedPool> pools;
  for (const auto& [endpoint, pool] : impl_->transport->MappedPools()) {
    pools.push_back(MappedPool{endpoint, pool->base, pool->size});
  }
  return pools;
}

void Client::MapLocalPools() { impl_->MapLocalPools(); }

void Client::Impl::MapLocalPools() {
  absl::StatusOr<v1::GetClusterStatusResponse> status =
      master.GetClusterStatus(v1::GetClusterStatusRequest());
  if (!status.ok()) return;
  for (const v1::SegmentStatus& segment : status->segments()) {
    if (segment.machine_id() == machine_id && !segment.shm_socket().empty()) {
      transport->LocalPool(segment.endpoint(), /*incarnation=*/0);
    }
  }
}

absl::Status Client::RegisterMemory(void* addr, size_t length) {
  return impl_->transport->RegisterMemory(addr, length);
}

absl::StatusOr<DrainReport> Client::DrainSegment(absl::string_view name,
                                                 const DrainOptions& options) {
  v1::DrainSegmentRequest request;
  request.set_name(std::string(name));
  request.set_migrate(options.migrate);
  if (absl::Status draining = impl_->master.DrainSegment(request).status(); !draining.ok()) {
    return draining;
  }
  DrainReport report;
  if (!options.migrate) return report;
  std::string buffer;
  while (true) {
    v1::MigrateStartRequest ask;
    ask.set_segment(std::string(name));
    ask.set_max_objects(static_cast<uint32_t>(options.batch_objects));
    ask.set_max_bytes(options.batch_bytes);
    absl::StatusOr<v1::MigrateStartResponse> batch = impl_->master.MigrateStart(ask);
    if (!batch.ok()) return batch.status();
    report.unplaceable = batch->unplaceable();
    if (batch->migrations().empty()) {
      if (batch->in_flight() == 0) return report;
      // Objects still being written (or copied by another mover): ask again shortly.
      absl::SleepFor(absl::Milliseconds(100));
      continue;
    }
    std::vector<bool> copied = impl_->CopyMigrations(batch->migrations(), buffer);
    v1::MigrateEndRequest end;
    for (int i = 0; i < batch->migrations_size(); ++i) {
      v1::MigrateEndItem* item = end.add_items();
      item->set_key(batch->migrations(i).key());
      item->set_migration_id(batch->migrations(i).migration_id());
      item->set_copied(copied[i]);
    }
    absl::StatusOr<v1::MigrateEndResponse> ended = impl_->master.MigrateEnd(end);
    if (!ended.ok()) return ended.status();
    if (ended->results_size() != end.items_size()) {
      return CountMismatch(ended->results_size(), end.items_size());
    }
    for (int i = 0; i < end.items_size(); ++i) {
      if (copied[i] && ended->results(i).code() == v1::OK) {
        ++report.moved_objects;
        report.moved_bytes += batch->migrations(i).size();
      } else {
        ++report.failed_copies;
      }
    }
    if (options.progress) options.progress(report);
  }
}

v1::ReplicaCopyStartRequest Client::Impl::CopyRequest(absl::string_view key,
                                                     absl::Span<const std::string> targets,
                                                     absl::string_view move_from) {
  v1::ReplicaCopyStartRequest request;
  request.set_key(std::string(key));
  for (const std::string& target : targets) request.add_targets(target);
  request.set_source(std::string(move_from));
  request.set_move(!move_from.empty());
  return request;
}

absl::Status Client::CheckCopyReplica(absl::string_view key, absl::Span<const std::string> targets,
                                      absl::string_view move_from) {
  v1::ReplicaCopyStartRequest request = Impl::CopyRequest(key, targets, move_from);
  request.set_dry_run(true);
  absl::StatusOr<v1::ReplicaCopyStartResponse> answer = impl_->master.ReplicaCopyStart(request);
  if (!answer.ok()) return answer.status();
  return FromErrorCode(answer->code(), answer->message());
}

absl::Status Client::CopyReplica(absl::string_view key, absl::Span<const std::string> targets,
                                 absl::string_view move_from) {
  const v1::ReplicaCopyStartRequest request = Impl::CopyRequest(key, targets, move_from);
  // Another copy of the object in flight (another task, a drain) is waited for this long.
  const absl::Time give_up = absl::Now() + impl_->options.transfer_timeout;
  std::string buffer;
  absl::Status done = absl::OkStatus();
  while (true) {
    absl::StatusOr<v1::ReplicaCopyStartResponse> answer = impl_->master.ReplicaCopyStart(request);
    if (!answer.ok()) {
      done = answer.status();
      break;
    }
    if (answer->code() == v1::OBJECT_ALREADY_EXISTS) {
      // Every target holds a replica. A move whose target had one already only drops the
      // source's (forced: a reader's lease keeps the range from reuse until it ends).
      if (!move_from.empty()) done = BatchDropReplicas({std::string(key)}, move_from, true)[0];
      break;
    }
    if (answer->code() == v1::OBJECT_HAS_LEASE && absl::Now() < give_up) {
      absl::SleepFor(absl::Milliseconds(20));
      continue;
    }
    if (answer->code() != v1::OK) {
      done = FromErrorCode(answer->code(), answer->message());
      break;
    }
    const v1::Migration& migration = answer->migration();
    google::protobuf::RepeatedPtrField<v1::Migration> one;
    *one.Add() = migration;
    const bool copied = impl_->CopyMigrations(one, buffer)[0];
    v1::MigrateEndRequest end;
    v1::MigrateEndItem* item = end.add_items();
    item->set_key(std::string(key));
    item->set_migration_id(migration.migration_id());
    item->set_copied(copied);
    absl::StatusOr<v1::MigrateEndResponse> ended = impl_->master.ReplicaCopyEnd(end);
    if (ended.ok() && ended->results_size() != 1) ended = CountMismatch(ended->results_size(), 1);
    if (!ended.ok()) {
      done = ended.status();
      break;
    }
    if (!copied) {
      done = ErrorStatus(v1::TRANSFER_FAIL,
                         absl::StrCat("the copy could not be read from segment ",
                                      migration.source().segment_name(), " (or did not match "
                                      "its checksum) or written to segment ",
                                      migration.destination().segment_name()));
      break;
    }
    done = FromErrorCode(ended->results(0).code(), ended->results(0).message());
    if (!done.ok() || !move_from.empty()) break;
  }
  // This client's own cached location of the key may name a replica that is gone.
  impl_->ForgetLocations({std::string(key)});
  return done;
}

std::vector<bool> Client::Impl::CopyMigrations(
    const google::protobuf::RepeatedPtrField<v1::Migration>& batch, std::string& buffer) {
  const int n = batch.size();
  std::vector<bool> copied(n, false);
  uint64_t total = 0;
  for (const v1::Migration& migration : batch) total += migration.size();
  if (buffer.size() < total) buffer.resize(total);
  // One op per copy, for the read (from the source) or the write (to the destination).
  auto ops_for = [&](wire::Opcode opcode, const std::vector<bool>& wanted,
                     std::vector<int>& owners) {
    std::vector<TransferOp> ops;
    uint64_t offset = 0;
    for (int i = 0; i < n; ++i) {
      const v1::Migration& migration = batch[i];
      const v1::Placement& placement =
          opcode == wire::Opcode::kRead ? migration.source() : migration.destination();
      char* bytes = buffer.data() + offset;
      offset += migration.size();
      if (!wanted[i]) continue;
      absl::StatusOr<TransferOp> op =
          MakeOp(opcode, placement, migration.size(), {iovec{bytes, migration.size()}});
      if (!op.ok()) continue;
      ops.push_back(*std::move(op));
      owners.push_back(i);
    }
    return ops;
  };
  std::vector<int> readers;
  std::vector<TransferOp> reads = ops_for(wire::Opcode::kRead, std::vector<bool>(n, true), readers);
  transport->Execute(absl::MakeSpan(reads), TransferDeadline());
  std::vector<bool> intact(n, false);
  for (size_t r = 0; r < reads.size(); ++r) {
    const v1::Migration& migration = batch[readers[r]];
    // A copy that does not match the checksum the writer gave would spread corruption.
    intact[readers[r]] = reads[r].status.ok() &&
                         (migration.checksum() == 0 ||
                          wire::Checksum(reads[r].iov) == migration.checksum());
  }
  std::vector<int> writers;
  std::vector<TransferOp> writes = ops_for(wire::Opcode::kWrite, intact, writers);
  transport->Execute(absl::MakeSpan(writes), TransferDeadline());
  for (size_t w = 0; w < writes.size(); ++w) copied[writers[w]] = writes[w].status.ok();
  return copied;
}

}  // namespace kvpool
