#include "kvpool/client.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <mutex>
#include <numeric>
#include <thread>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "client/client_builder.h"
#include "client/master_client.h"
#include "client/routing_transport.h"
#include "client/segment_directory.h"
#include "client/tcp_transport.h"
#include "common/latency_histogram.h"
#include "common/metric_families.h"
#include "common/net.h"
#include "common/task_pool.h"
#include "kvpool/client_metrics.h"
#include "proto/checksum.h"
#include "proto/error_codes.h"
#include "proto/key_read.h"
#include "proto/tls.h"

namespace kvpool {

using client::TransferOp;

namespace {

// The op moving `placement`'s bytes between `iov` and the segment.
TransferOp OpFor(wire::Opcode opcode, const client::Placement& placement, std::vector<iovec> iov) {
  return TransferOp{.opcode = opcode,
                    .endpoint = placement.endpoint,
                    .host = placement.host,
                    .incarnation = placement.incarnation,
                    .offset = placement.offset,
                    .length = placement.length,
                    .token = placement.token,
                    .iov = std::move(iov)};
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
  Impl(const ClientOptions& o, std::unique_ptr<client::MasterClient> master_client,
       std::unique_ptr<client::Transport> data_transport)
      : options(o),
        local_host(o.local_host.empty() ? LocalHostName() : o.local_host),
        machine_id(MachineId()),
        master(std::move(master_client)),
        directory(*master, machine_id, kDirectoryPeriod),
        routing(std::make_unique<client::RoutingTransport>(
            o.transport,
            [this](const std::string& endpoint) { return directory.ShmSocket(endpoint); },
            client::TcpTransportOptions{
                .connections_per_endpoint = o.connections_per_segment,
                .tls = o.data_tls ? std::optional(TlsOptionsOf(o)) : std::nullopt},
            o.rdma_device)),
        fake_transport(std::move(data_transport)),
        transport(fake_transport != nullptr ? fake_transport.get() : routing.get()) {}

  // Maps the pools of the segments of this machine known so far, before any placement or
  // lease is asked for: mapping (and populating) a large pool can take longer than a write
  // grant or a lease lasts (30 s for 4 GiB on a loaded machine), so it must not happen
  // between a placement and its bytes. Pools mapped already cost a lookup each.
  void MapKnownLocalPools();

  absl::Time TransferDeadline() const { return absl::Now() + options.transfer_timeout; }

  // A key's answer from the master, or from the location cache within the lease that
  // answer granted: while it runs the object can be neither evicted nor removed (unless
  // forced), so its placement still holds.
  struct Located {
    std::string key;
    client::Location location;
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
  // sets their results. `targets[i]` must hold located[i].location.size bytes. Checks
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

  // Step G1 then G2 for a batch, once: keys read by key first (ReadByKey), the rest
  // through the master (BatchGetLocated).
  std::vector<absl::StatusOr<uint64_t>> BatchGetOnce(absl::Span<const GetItem> items,
                                                     const GetOptions& options);
  std::vector<absl::StatusOr<uint64_t>> BatchGetLocated(absl::Span<const GetItem> items,
                                                        const GetOptions& options);
  // Reads by key (ClientOptions::read_by_key): each key with no kept location whose home
  // segment the directory knows, in one transport call, no master call. A value that came
  // and matches the segment's checksum for it sets its result; returns the indices of the
  // others (not there, not tried, or failed: the master is asked for those).
  std::vector<size_t> ReadByKey(absl::Span<const GetItem> items,
                                std::vector<absl::StatusOr<uint64_t>>& results);

  // Copies objects as the master planned them (a drain, a replica copy): reads each from its
  // source into `buffer`, checks its checksum, writes it to its destination. Whether each
  // copy was made, in order.
  std::vector<bool> CopyMigrations(absl::Span<const client::Migration> batch,
                                   std::string& buffer);

  // Replica indices of `location`, those on this host first.
  std::vector<int> ReplicaOrder(const client::Location& location);

  // The segment list is read again this often (and soon after a lookup it did not know).
  static constexpr absl::Duration kDirectoryPeriod = absl::Seconds(5);

  const ClientOptions options;
  const std::string local_host;
  const std::string machine_id;
  const std::unique_ptr<client::MasterClient> master;
  client::SegmentDirectory directory;
  std::unique_ptr<client::RoutingTransport> routing;
  // Tests move bytes through a transport of their own (ClientBuilder); null otherwise.
  std::unique_ptr<client::Transport> fake_transport;
  // Every op of a get, put or copy: `routing`, or the test's transport.
  client::Transport* const transport;

  // Checksums of many values (XXH3 runs at ~10 GB/s per core: large batches use several).
  std::vector<uint64_t> Checksums(const std::vector<std::vector<iovec>>& values);
  TaskPool workers{static_cast<int>(std::clamp(std::thread::hardware_concurrency() / 2, 1u, 8u)) - 1};
  // The thread that hashes a put batch while the calling thread moves its bytes: a pool of
  // its own (Checksums runs batches on `workers`, and a task of `workers` waiting on more
  // tasks of `workers` could wait for ever once every thread does so).
  TaskPool put_hasher{1};

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
  std::atomic<uint64_t> master_lookups{0};
  std::atomic<uint64_t> key_reads{0};
  std::atomic<uint64_t> key_read_misses{0};
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
  // Mapped already: a lookup each. Refused or failed: not asked again for a while.
  for (const std::string& endpoint : directory.LocalShmEndpoints()) {
    routing->LocalPool(endpoint, /*incarnation=*/0);
  }
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
  client::RoutingTransport::Stats transport = impl.routing->stats();
  families.Counter("kvpool_client_transfers_total", "Replica transfers, by transport.",
                   static_cast<double>(transport.shm_ops), {{"transport", "shm"}});
  families.Counter("kvpool_client_transfers_total", "Replica transfers, by transport.",
                   static_cast<double>(transport.rdma_ops), {{"transport", "rdma"}});
  families.Counter("kvpool_client_transfers_total", "Replica transfers, by transport.",
                   static_cast<double>(transport.tcp_ops), {{"transport", "tcp"}});
  families.Counter("kvpool_client_location_cache_hits_total",
                   "Keys located from the client's lease cache instead of the master.",
                   static_cast<double>(impl.location_cache_hits.load()));
  families.Counter("kvpool_client_master_lookups_total",
                   "Calls to the master to locate keys (one per batch that missed the cache).",
                   static_cast<double>(impl.master_lookups.load()));
  const char* kKeyReads =
      "Keys read by key from their home segment, without the master (hit), "
      "or asked of the master after such a read found nothing there (miss).";
  families.Counter("kvpool_client_key_reads_total", kKeyReads,
                   static_cast<double>(impl.key_reads.load()), {{"result", "hit"}});
  families.Counter("kvpool_client_key_reads_total", kKeyReads,
                   static_cast<double>(impl.key_read_misses.load()), {{"result", "miss"}});
  return families.Take();
}

std::string Client::MetricsText() const { return SerializeMetrics(ClientMetrics(*this).Collect()); }

std::vector<int> Client::Impl::ReplicaOrder(const client::Location& location) {
  std::vector<int> order(location.replicas.size());
  std::iota(order.begin(), order.end(), 0);
  if (order.size() > 1) {
    std::stable_partition(order.begin(), order.end(), [&](int i) {
      const client::Placement& replica = location.replicas[i];
      return replica.host == local_host || directory.ShmSocket(replica.endpoint).has_value();
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
          it == locations.end() ? kCacheMargin
                                : std::max(kCacheMargin, it->second.location.lease / 2);
      if (it != locations.end() && it->second.location.lease_expiry - margin > now) {
        located[i] = it->second;
        location_cache_hits.fetch_add(1, std::memory_order_relaxed);
      } else {
        if (it != locations.end() && it->second.location.lease_expiry - kFallbackMargin > now) {
          renewing.emplace(missing.size(), it->second);
        }
        located[i].key = keys[i];
        missing.push_back(i);
      }
    }
  }
  if (missing.empty()) return located;
  std::vector<std::string> asked;
  asked.reserve(missing.size());
  for (size_t i : missing) asked.push_back(keys[i]);
  master_lookups.fetch_add(1, std::memory_order_relaxed);
  absl::StatusOr<std::vector<client::Location>> answer = master->BatchGetReplicaList(
      asked, {.timeout = renewing.size() == missing.size() ? std::optional(kRenewTimeout)
                                                           : std::nullopt});
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
    client::Location& fresh = (*answer)[k];
    if (auto old = renewing.find(k);
        old != renewing.end() && ToErrorCode(fresh.status) == ErrorCode::OBJECT_NOT_FOUND) {
      entry = std::move(old->second);
      continue;
    }
    entry.location = std::move(fresh);
    if (options.cache_locations && entry.location.status.ok()) {
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
  for (size_t i : wanted) order[i] = ReplicaOrder(located[i].location);
  std::vector<size_t> waiting = std::move(wanted);
  std::vector<std::string> stale;
  absl::Time deadline = TransferDeadline();
  while (!waiting.empty()) {
    std::vector<TransferOp> ops;
    std::vector<size_t> owners;
    for (size_t i : waiting) {
      const client::Location& location = located[i].location;
      ops.push_back(OpFor(wire::Opcode::kRead, location.replicas[order[i][tried[i]++]],
                          targets[i]));
      ops.back().hash = (get_options.verify_checksum || options.verify_checksums ||
                         located[i].cached) &&
                        location.checksum != 0;
      owners.push_back(i);
    }
    transport->Execute(absl::MakeSpan(ops), deadline);
    waiting.clear();
    absl::Time finished = absl::Now();
    // The values to check that the transport did not hash as they arrived, hashed together
    // (on several threads for a large batch).
    std::vector<bool> check(ops.size(), false);
    std::vector<std::vector<iovec>> to_hash;
    std::vector<size_t> hashed;  // ops whose values are in to_hash
    for (size_t k = 0; k < ops.size(); ++k) {
      size_t i = owners[k];
      bool lease_ran_out = finished > located[i].location.lease_expiry;
      check[k] = ops[k].status.ok() && (ops[k].hash || lease_ran_out) &&
                 located[i].location.checksum != 0;
      if (check[k] && !ops[k].checksum.has_value()) {
        hashed.push_back(k);
        to_hash.push_back(targets[i]);
      }
    }
    std::vector<uint64_t> sums = to_hash.empty() ? std::vector<uint64_t>() : Checksums(to_hash);
    for (size_t h = 0; h < hashed.size(); ++h) ops[hashed[h]].checksum = sums[h];
    for (size_t k = 0; k < ops.size(); ++k) {
      size_t i = owners[k];
      const client::Location& location = located[i].location;
      if (ops[k].status.ok()) {
        bool lease_ran_out = finished > location.lease_expiry;
        if (check[k] && *ops[k].checksum != location.checksum) {
          results[i] = lease_ran_out
                           ? ErrorStatus(ErrorCode::LEASE_EXPIRED,
                                         "the read outlasted its lease and the object changed")
                           : ErrorStatus(ErrorCode::CHECKSUM_MISMATCH,
                                         absl::StrCat("bytes read from ", ops[k].endpoint,
                                                      " do not match the writer's checksum"));
        } else {
          results[i] = location.size;
        }
      } else if (tried[i] < order[i].size() &&
                 ops[k].status.code() != absl::StatusCode::kDeadlineExceeded &&
                 ToErrorCode(ops[k].status) != ErrorCode::LEASE_EXPIRED) {
        waiting.push_back(i);  // try the next replica
      } else {
        results[i] = ops[k].status;
      }
      if (!results[i].ok() && located[i].cached) {
        // The answer is old (the object was force-removed, its segment lost or drained):
        // forget it and let the caller's LEASE_EXPIRED retry ask the master afresh.
        stale.push_back(located[i].key);
        results[i] = ErrorStatus(
            ErrorCode::LEASE_EXPIRED,
            absl::StrCat("cached location failed: ", results[i].status().message()));
      }
    }
  }
  if (!stale.empty()) ForgetLocations(stale);
}

std::vector<absl::StatusOr<uint64_t>> Client::Impl::BatchGetOnce(absl::Span<const GetItem> items,
                                                               const GetOptions& options) {
  std::vector<absl::StatusOr<uint64_t>> results(items.size(), uint64_t{0});
  std::vector<size_t> rest = ReadByKey(items, results);
  if (rest.size() == items.size()) return BatchGetLocated(items, options);
  if (rest.empty()) return results;
  std::vector<GetItem> remaining;
  remaining.reserve(rest.size());
  for (size_t i : rest) remaining.push_back(items[i]);
  std::vector<absl::StatusOr<uint64_t>> located = BatchGetLocated(remaining, options);
  for (size_t k = 0; k < rest.size(); ++k) results[rest[k]] = std::move(located[k]);
  return results;
}

std::vector<size_t> Client::Impl::ReadByKey(absl::Span<const GetItem> items,
                                            std::vector<absl::StatusOr<uint64_t>>& results) {
  std::vector<size_t> rest;
  std::vector<TransferOp> ops;
  std::vector<size_t> owners;
  for (size_t i = 0; i < items.size(); ++i) {
    bool kept = false;
    if (options.read_by_key && options.cache_locations) {
      absl::MutexLock lock(&cache_mu);
      kept = locations.contains(items[i].key);
    }
    std::optional<client::SegmentDirectory::KeyHome> home;
    if (options.read_by_key && !kept) home = directory.HomeOf(items[i].key);
    uint64_t capacity = 0;
    for (const MutableBuffer& part : items[i].parts) capacity += part.size;
    // Only where the bytes would go over TCP anyway: a read from a kept location over shared
    // memory or RDMA costs no TCP round trip, and reads by key keep no location.
    if (!home.has_value() || capacity == 0 || items[i].key.size() > wire::kMaxKeyReadKey ||
        routing->BypassesTcp(home->local)) {
      rest.push_back(i);
      continue;
    }
    ops.push_back(TransferOp{.opcode = wire::Opcode::kReadKey,
                             .endpoint = home->endpoint,
                             .length = capacity,
                             .token = home->credential,
                             .iov = Truncated(items[i].parts, capacity),
                             .tenant = std::move(home->tenant),
                             .key = items[i].key,
                             .hash = true});
    owners.push_back(i);
  }
  if (ops.empty()) return rest;
  transport->Execute(absl::MakeSpan(ops), TransferDeadline());
  for (size_t k = 0; k < ops.size(); ++k) {
    TransferOp& op = ops[k];
    // A value cut by a removal, a range reused: the segment's checksum tells it; the master
    // is asked then, as for a key not there.
    if (op.status.ok() &&
        (op.checksum.has_value() ? *op.checksum : wire::Checksum(op.iov)) == op.key_checksum) {
      results[owners[k]] = op.length;
      key_reads.fetch_add(1, std::memory_order_relaxed);
    } else {
      rest.push_back(owners[k]);
      key_read_misses.fetch_add(1, std::memory_order_relaxed);
    }
  }
  std::sort(rest.begin(), rest.end());
  return rest;
}

std::vector<absl::StatusOr<uint64_t>> Client::Impl::BatchGetLocated(absl::Span<const GetItem> items,
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
    const client::Location& location = (*located)[i].location;
    if (!location.status.ok()) {
      results[i] = location.status;
      continue;
    }
    uint64_t capacity = 0;
    for (const MutableBuffer& part : items[i].parts) capacity += part.size;
    if (capacity < location.size) {
      results[i] = ErrorStatus(ErrorCode::BUFFER_OVERFLOW,
                               absl::StrCat("buffers hold ", capacity, " bytes but the object has ",
                                            location.size));
      continue;
    }
    targets[i] = Truncated(items[i].parts, location.size);
    wanted.push_back(i);
  }
  ReadLocated(*located, std::move(wanted), targets, options, results);
  return results;
}

Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Client::~Client() = default;

absl::StatusOr<std::unique_ptr<Client>> ClientBuilder::Build(
    const ClientOptions& options, std::unique_ptr<client::MasterClient> master,
    std::unique_ptr<client::Transport> transport) {
  auto impl = std::make_unique<Client::Impl>(options, std::move(master), std::move(transport));
  if (absl::Status ready = impl->master->WaitForMaster(options.connect_timeout); !ready.ok()) {
    return ready;
  }
  // The segments known now, so that the first writes and reads route to this machine's
  // segments and map their pools before any placement (a write held up between a placement
  // and its bytes lands late, and shared-memory writes are fenced only by their intents:
  // docs/semantics.md); from then on the list is refreshed in the background.
  (void)impl->directory.Refresh();
  impl->directory.Start();
  return std::unique_ptr<Client>(new Client(std::move(impl)));
}

absl::StatusOr<std::unique_ptr<Client>> Client::Create(const ClientOptions& options) {
  if (absl::Status tls = ValidateClientTls(TlsOptionsOf(options)); !tls.ok()) return tls;
  if (options.data_tls && options.tls_ca_file.empty()) {
    return absl::InvalidArgumentError("data_tls needs tls_ca_file, the CA of the segments");
  }
  absl::StatusOr<std::unique_ptr<MasterLocator>> locator =
      MasterLocator::Create(options.master_address, kDefaultEtcdPrefix, TlsOptionsOf(options));
  if (!locator.ok()) return locator.status();
  return ClientBuilder::Build(
      options,
      client::MakeGrpcMasterClient(std::move(*locator), options.rpc_timeout,
                                   TlsOptionsOf(options), options.auth_token),
      /*transport=*/nullptr);
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
  client::PutStartRequest start{.replicas = options.replicas,
                                .pin = options.pin,
                                .preferred_segments = options.preferred_segments};
  if (options.prefer_local_segment) {
    start.preferred_host = local_host;
    start.preferred_machine_id = machine_id;
  }
  for (const PutItem& item : items) {
    start.keys.push_back(item.key);
    start.sizes.push_back(std::accumulate(
        item.parts.begin(), item.parts.end(), uint64_t{0},
        [](uint64_t sum, const ConstBuffer& b) { return sum + b.size; }));
  }
  absl::StatusOr<std::vector<client::Reservation>> reserved = master->BatchPutStart(start);
  phase_done(kReserve);
  if (!reserved.ok()) return std::vector<absl::Status>(n, reserved.status());

  // Step P2: write every replica straight from the caller's buffers. Each value's checksum,
  // recorded at the commit, is taken by the transport as it sends the first replica where it
  // can (TCP: the bytes are then in the cache when the kernel copies them), else on
  // put_hasher while the bytes move (on this thread).
  constexpr size_t kNoOp = SIZE_MAX;
  std::vector<TransferOp> ops;
  std::vector<size_t> owners;
  std::vector<size_t> hashing_op(n, kNoOp);
  std::vector<std::vector<iovec>> beside;  // values put_hasher hashes
  std::vector<size_t> beside_items;
  for (size_t i = 0; i < n; ++i) {
    const client::Reservation& reservation = (*reserved)[i];
    results[i] = reservation.status;
    if (!results[i].ok()) continue;
    std::vector<iovec> iov;
    for (const ConstBuffer& part : items[i].parts) {
      if (part.size > 0) iov.push_back(iovec{const_cast<void*>(part.data), part.size});
    }
    for (const client::Placement& placement : reservation.placements) {
      ops.push_back(OpFor(wire::Opcode::kWrite, placement, iov));
      owners.push_back(i);
      if (hashing_op[i] == kNoOp && transport->HashesWrite(ops.back())) {
        ops.back().hash = true;
        hashing_op[i] = ops.size() - 1;
      }
    }
    if (hashing_op[i] == kNoOp) {
      beside.push_back(std::move(iov));
      beside_items.push_back(i);
    }
  }
  auto write = [&] {
    transport->Execute(absl::MakeSpan(ops), TransferDeadline());
    phase_done(kWrite);
  };
  std::vector<uint64_t> sums;
  if (beside.empty()) {
    write();
  } else {
    put_hasher.Run({write, [&] { sums = Checksums(beside); }});
  }
  phase_done(kChecksumWait);
  for (size_t k = 0; k < ops.size(); ++k) {
    if (!ops[k].status.ok() && results[owners[k]].ok()) results[owners[k]] = ops[k].status;
  }
  std::vector<uint64_t> checksums(n);
  for (size_t k = 0; k < beside_items.size(); ++k) checksums[beside_items[k]] = sums[k];
  for (size_t i = 0; i < n; ++i) {
    if (hashing_op[i] == kNoOp || !results[i].ok()) continue;
    // A transport that took the op elsewhere than it said leaves it to be hashed here.
    const TransferOp& op = ops[hashing_op[i]];
    checksums[i] = op.checksum.has_value() ? *op.checksum : wire::Checksum(op.iov);
  }

  // Step P3: commit what was written; revoke what was not, so its space is freed at once
  // (every reservation the master made, including one whose placements it got wrong).
  std::vector<client::PutEnd> end;
  std::vector<client::PutEnd> revoke;
  std::vector<size_t> committed;
  for (size_t i = 0; i < n; ++i) {
    const uint64_t put_id = (*reserved)[i].put_id;
    // No reservation (dedup, no space): nothing to end. A written key is always committed.
    if (put_id == 0 && !(*reserved)[i].status.ok()) continue;
    if (results[i].ok()) {
      end.push_back({.key = items[i].key, .put_id = put_id, .checksum = checksums[i]});
      committed.push_back(i);
    } else {
      revoke.push_back({.key = items[i].key, .put_id = put_id});
    }
  }
  // A commit the master could not make durable on every replica's segment in time is
  // WRITE_FAIL; committing again with the same put_id is safe, so it is retried a few times
  // (each waits up to the master's manifest sync timeout) before the caller hears of it.
  constexpr int kCommitAttempts = 3;
  for (int attempt = 0; attempt < kCommitAttempts && !committed.empty(); ++attempt) {
    absl::StatusOr<std::vector<absl::Status>> ended = master->BatchPutEnd(end);
    std::vector<client::PutEnd> retry;
    std::vector<size_t> again;
    for (size_t k = 0; k < committed.size(); ++k) {
      absl::Status answer = ended.ok() ? (*ended)[k] : ended.status();
      // A retried commit whose object went away meanwhile (its segment declared dead) was
      // never durable: it stays WRITE_FAIL (put again), not a miss.
      if (attempt == 0 || ToErrorCode(answer) != ErrorCode::OBJECT_NOT_FOUND) {
        results[committed[k]] = answer;
      }
      if (ended.ok() && ToErrorCode(answer) == ErrorCode::WRITE_FAIL) {
        retry.push_back(end[k]);
        again.push_back(committed[k]);
      }
    }
    end = std::move(retry);
    committed = std::move(again);
  }
  phase_done(kCommit);
  if (!revoke.empty()) {
    // Best effort: a reservation that is not revoked expires on the master by itself.
    (void)master->BatchPutRevoke(revoke);
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
    const client::Location& location = (*located)[0].location;
    if (!location.status.ok()) return location.status;
    // What the master says is checked before it sizes an allocation: a bad answer is an
    // error, never an abort (or an attempt to allocate petabytes).
    constexpr uint64_t kMaxValueBytes = uint64_t{64} << 30;
    if (location.size == 0 || location.size > kMaxValueBytes) {
      return absl::InternalError(
          absl::StrCat("master answered a size of ", location.size, " bytes for \"", key,
                       "\" (want 1 to ", kMaxValueBytes, "; use the buffer variant of Get)"));
    }
    std::string value(location.size, '\0');
    std::vector<std::vector<iovec>> targets = {{iovec{value.data(), value.size()}}};
    std::vector<absl::StatusOr<uint64_t>> results(1);
    ReadLocated(*located, {0}, targets, options, results);
    if (results[0].ok()) return value;
    status = results[0].status();
    if (ToErrorCode(status) != ErrorCode::LEASE_EXPIRED) break;
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
    if (!results[i].ok() && ToErrorCode(results[i].status()) == ErrorCode::LEASE_EXPIRED) {
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
  // The master's answer, not a cached one: another client may have removed the key and put
  // another value under it, and nothing is read here that a checksum would catch.
  std::string k(key);
  absl::StatusOr<std::vector<client::Location>> located =
      impl_->master->BatchGetReplicaList(absl::MakeConstSpan(&k, 1));
  if (!located.ok()) return located.status();
  if (!(*located)[0].status.ok()) return (*located)[0].status;
  return (*located)[0].size;
}

absl::StatusOr<bool> Client::Exists(absl::string_view key) {
  std::string k(key);
  return BatchExist(absl::MakeConstSpan(&k, 1))[0];
}

std::vector<absl::StatusOr<bool>> Client::BatchExist(absl::Span<const std::string> keys) {
  absl::StatusOr<std::vector<absl::StatusOr<bool>>> results = impl_->master->BatchExist(keys);
  if (!results.ok()) return std::vector<absl::StatusOr<bool>>(keys.size(), results.status());
  return *std::move(results);
}

absl::Status Client::Remove(absl::string_view key, bool force) {
  std::string k(key);
  return BatchRemove(absl::MakeConstSpan(&k, 1), force)[0];
}

std::vector<absl::Status> Client::BatchRemove(absl::Span<const std::string> keys, bool force) {
  impl_->ForgetLocations(keys);
  return impl_->master->BatchRemove(keys, force);
}

std::vector<absl::Status> Client::BatchDropReplicas(absl::Span<const std::string> keys,
                                                    absl::string_view segment, bool force) {
  impl_->ForgetLocations(keys);
  return impl_->master->BatchDropReplicas(keys, segment, force);
}

absl::StatusOr<uint64_t> Client::RemoveAll(bool force) {
  {
    absl::MutexLock lock(&impl_->cache_mu);
    impl_->locations.clear();
  }
  return impl_->master->RemoveAll(force, /*key_regex=*/"");
}

absl::StatusOr<uint64_t> Client::RemoveByRegex(absl::string_view pattern, bool force) {
  if (pattern.empty()) return absl::InvalidArgumentError("remove by regex: the pattern is empty");
  {
    absl::MutexLock lock(&impl_->cache_mu);
    impl_->locations.clear();
  }
  return impl_->master->RemoveAll(force, pattern);
}

std::vector<absl::StatusOr<std::vector<ReplicaLocation>>> Client::BatchReplicaLocations(
    absl::Span<const std::string> keys) {
  // Where the replicas are now (an operator's or a task's question): the master's answer,
  // never a cached one, which a copy or move by another client leaves behind.
  absl::StatusOr<std::vector<client::Location>> located =
      impl_->master->BatchGetReplicaList(keys);
  std::vector<absl::StatusOr<std::vector<ReplicaLocation>>> results;
  results.reserve(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    if (!located.ok()) {
      results.push_back(located.status());
      continue;
    }
    const client::Location& location = (*located)[i];
    if (!location.status.ok()) {
      results.push_back(location.status);
      continue;
    }
    std::vector<ReplicaLocation> replicas;
    for (const client::Placement& p : location.replicas) {
      replicas.push_back(ReplicaLocation{p.segment_name, p.endpoint, p.offset, p.length});
    }
    results.push_back(std::move(replicas));
  }
  return results;
}

absl::StatusOr<ClusterStatus> Client::GetClusterStatus() { return impl_->master->GetClusterStatus(); }

std::vector<absl::StatusOr<LocalValue>> Client::BatchGetLocal(absl::Span<const std::string> keys,
                                                              absl::Time* lease_expiry) {
  impl_->MapKnownLocalPools();
  const size_t n = keys.size();
  // Always the master's answer, never a cached one: the caller reads the pool itself, so a
  // cached location gone stale would not be caught by the client's checksum check. Nor
  // tokens: no token is checked on a pool this process mapped.
  impl_->master_lookups.fetch_add(1, std::memory_order_relaxed);
  absl::StatusOr<std::vector<client::Location>> located =
      impl_->master->BatchGetReplicaList(keys, {.tokens = false});
  if (!located.ok()) return std::vector<absl::StatusOr<LocalValue>>(n, located.status());
  std::vector<absl::StatusOr<LocalValue>> results;
  results.reserve(n);
  absl::Time expiry = absl::InfiniteFuture();
  for (const client::Location& location : *located) {
    if (!location.status.ok()) {
      results.push_back(location.status);
      continue;
    }
    expiry = std::min(expiry, location.lease_expiry);
    absl::StatusOr<LocalValue> value =
        absl::FailedPreconditionError("no replica on a segment this process can map");
    for (const client::Placement& replica : location.replicas) {
      std::shared_ptr<const client::ShmTransport::Pool> pool =
          impl_->routing->LocalPool(replica.endpoint, replica.incarnation);
      if (pool == nullptr || replica.offset + replica.length > pool->size) continue;
      value = LocalValue{pool->base + replica.offset, replica.length, location.checksum};
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
  client::PutStartRequest start{.keys = std::vector<std::string>(keys.begin(), keys.end()),
                                .sizes = std::vector<uint64_t>(sizes.begin(), sizes.end()),
                                .replicas = 1,
                                .pin = options.pin,
                                .preferred_host = impl_->local_host,
                                .preferred_machine_id = impl_->machine_id};
  absl::StatusOr<std::vector<client::Reservation>> reserved = impl_->master->BatchPutStart(start);
  if (!reserved.ok()) return std::vector<absl::StatusOr<LocalReservation>>(n, reserved.status());
  std::vector<absl::StatusOr<LocalReservation>> results;
  std::vector<client::PutEnd> revoke;
  // The write intents to ask for, by pool.
  struct PoolIntents {
    std::string endpoint;
    std::shared_ptr<const client::ShmTransport::Pool> pool;
    std::vector<size_t> index;  // into results
    std::vector<wire::ShmIntent> intents;
  };
  std::vector<PoolIntents> intents;
  for (size_t i = 0; i < n; ++i) {
    const client::Reservation& reservation = (*reserved)[i];
    if (!reservation.status.ok()) {
      if (reservation.put_id != 0) revoke.push_back({.key = keys[i], .put_id = reservation.put_id});
      results.push_back(reservation.status);
      continue;
    }
    const client::Placement& placement = reservation.placements[0];
    std::shared_ptr<const client::ShmTransport::Pool> pool =
        impl_->routing->LocalPool(placement.endpoint, placement.incarnation);
    if (pool == nullptr || placement.offset + placement.length > pool->size) {
      revoke.push_back({.key = keys[i], .put_id = reservation.put_id});
      results.push_back(absl::FailedPreconditionError(
          "no segment this process can map had room; use BatchPut"));
      continue;
    }
    results.push_back(LocalReservation{keys[i], pool->base + placement.offset, placement.length,
                                       reservation.put_id, reservation.deadline,
                                       /*checksum=*/std::nullopt, placement.endpoint});
    wire::ShmIntent intent{placement.offset, placement.length};
    intent.token = placement.token;
    auto it = std::find_if(intents.begin(), intents.end(),
                           [&](const auto& entry) { return entry.pool == pool; });
    if (it == intents.end()) it = intents.insert(intents.end(), {placement.endpoint, pool});
    it->index.push_back(results.size() - 1);
    it->intents.push_back(intent);
  }
  // The caller writes straight into the pool: the segment accepts each write first (its
  // write intent), as it would check a TCP write's token.
  for (const PoolIntents& pool : intents) {
    std::vector<absl::StatusOr<uint64_t>> begun =
        impl_->routing->BeginLocalWrites(pool.endpoint, pool.pool, pool.intents);
    for (size_t k = 0; k < pool.index.size(); ++k) {
      absl::StatusOr<LocalReservation>& reservation = results[pool.index[k]];
      if (begun[k].ok()) {
        reservation->write_intent = *begun[k];
        continue;
      }
      revoke.push_back({.key = reservation->key, .put_id = reservation->put_id});
      reservation = begun[k].status();
    }
  }
  if (!revoke.empty()) (void)impl_->master->BatchPutRevoke(revoke);
  return results;
}

void Client::EndLocalWrites(absl::Span<const LocalReservation> reservations) {
  absl::flat_hash_map<std::string, std::vector<uint64_t>> done;
  for (const LocalReservation& reservation : reservations) {
    if (reservation.write_intent != 0) {
      done[reservation.endpoint].push_back(reservation.write_intent);
    }
  }
  for (const auto& [endpoint, ids] : done) impl_->routing->EndLocalWrites(endpoint, ids);
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
  std::vector<client::PutEnd> end;
  end.reserve(reservations.size());
  for (const LocalReservation& reservation : reservations) {
    end.push_back({.key = reservation.key,
                   .put_id = reservation.put_id,
                   .checksum = reservation.checksum.value_or(0)});
  }
  for (size_t k = 0; k < hashed.size(); ++k) end[hashed[k]].checksum = sums[k];
  absl::StatusOr<std::vector<absl::Status>> ended = impl_->master->BatchPutEnd(end);
  if (!ended.ok()) return std::vector<absl::Status>(reservations.size(), ended.status());
  uint64_t bytes = 0;
  for (size_t i = 0; i < reservations.size(); ++i) {
    if ((*ended)[i].ok()) bytes += reservations[i].size;
  }
  impl_->bytes_put.fetch_add(bytes, std::memory_order_relaxed);
  return *std::move(ended);
}

void Client::BatchAbandonLocal(absl::Span<const LocalReservation> reservations) {
  EndLocalWrites(reservations);
  std::vector<client::PutEnd> revoke;
  for (const LocalReservation& reservation : reservations) {
    revoke.push_back({.key = reservation.key, .put_id = reservation.put_id});
  }
  (void)impl_->master->BatchPutRevoke(revoke);
}

std::vector<MappedPool> Client::MappedPools() {
  std::vector<MappedPool> pools;
  for (const auto& [endpoint, pool] : impl_->routing->MappedPools()) {
    pools.push_back(MappedPool{endpoint, pool->base, pool->size});
  }
  return pools;
}

void Client::MapLocalPools() {
  // The list as the master has it now (a segment mounted since the last refresh included),
  // then every pool of this machine's segments.
  (void)impl_->directory.Refresh();
  for (const std::string& endpoint : impl_->directory.LocalShmEndpoints()) {
    impl_->routing->LocalPool(endpoint, /*incarnation=*/0);
  }
}

absl::Status Client::RegisterMemory(void* addr, size_t length) {
  return impl_->routing->RegisterMemory(addr, length);
}

absl::StatusOr<DrainReport> Client::DrainSegment(absl::string_view name,
                                                 const DrainOptions& options) {
  if (absl::Status draining = impl_->master->DrainSegment(name, options.migrate);
      !draining.ok()) {
    return draining;
  }
  DrainReport report;
  if (!options.migrate) return report;
  std::string buffer;
  while (true) {
    absl::StatusOr<client::MigrationBatch> batch = impl_->master->MigrateStart(
        name, static_cast<uint32_t>(options.batch_objects), options.batch_bytes);
    if (!batch.ok()) return batch.status();
    report.unplaceable = batch->unplaceable;
    if (batch->migrations.empty()) {
      if (batch->in_flight == 0) return report;
      // Objects still being written (or copied by another mover): ask again shortly.
      absl::SleepFor(absl::Milliseconds(100));
      continue;
    }
    std::vector<bool> copied = impl_->CopyMigrations(batch->migrations, buffer);
    std::vector<client::MigrationEnd> end;
    for (size_t i = 0; i < batch->migrations.size(); ++i) {
      end.push_back({.key = batch->migrations[i].key,
                     .migration_id = batch->migrations[i].migration_id,
                     .copied = copied[i]});
    }
    absl::StatusOr<std::vector<absl::Status>> ended = impl_->master->MigrateEnd(end);
    if (!ended.ok()) return ended.status();
    for (size_t i = 0; i < end.size(); ++i) {
      if (copied[i] && (*ended)[i].ok()) {
        ++report.moved_objects;
        report.moved_bytes += batch->migrations[i].size;
      } else {
        ++report.failed_copies;
      }
    }
    if (options.progress) options.progress(report);
  }
}

absl::Status Client::CheckCopyReplica(absl::string_view key, absl::Span<const std::string> targets,
                                      absl::string_view move_from) {
  absl::StatusOr<client::CopyStart> answer =
      impl_->master->ReplicaCopyStart(key, targets, move_from, /*dry_run=*/true);
  if (!answer.ok()) return answer.status();
  return answer->status;
}

absl::Status Client::CopyReplica(absl::string_view key, absl::Span<const std::string> targets,
                                 absl::string_view move_from) {
  // Another copy of the object in flight (another task, a drain) is waited for this long.
  const absl::Time give_up = absl::Now() + impl_->options.transfer_timeout;
  std::string buffer;
  absl::Status done = absl::OkStatus();
  while (true) {
    absl::StatusOr<client::CopyStart> answer =
        impl_->master->ReplicaCopyStart(key, targets, move_from, /*dry_run=*/false);
    if (!answer.ok()) {
      done = answer.status();
      break;
    }
    const int32_t code = ToErrorCode(answer->status);
    if (code == ErrorCode::OBJECT_ALREADY_EXISTS) {
      // Every target holds a replica. A move whose target had one already only drops the
      // source's (forced: a reader's lease keeps the range from reuse until it ends).
      if (!move_from.empty()) done = BatchDropReplicas({std::string(key)}, move_from, true)[0];
      break;
    }
    if (code == ErrorCode::OBJECT_HAS_LEASE && absl::Now() < give_up) {
      absl::SleepFor(absl::Milliseconds(20));
      continue;
    }
    if (!answer->status.ok()) {
      done = answer->status;
      break;
    }
    const client::Migration& migration = answer->migration;
    const bool copied = impl_->CopyMigrations(absl::MakeConstSpan(&migration, 1), buffer)[0];
    client::MigrationEnd end{.key = std::string(key),
                             .migration_id = migration.migration_id,
                             .copied = copied};
    absl::StatusOr<std::vector<absl::Status>> ended =
        impl_->master->ReplicaCopyEnd(absl::MakeConstSpan(&end, 1));
    if (!ended.ok()) {
      done = ended.status();
      break;
    }
    if (!copied) {
      done = ErrorStatus(ErrorCode::TRANSFER_FAIL,
                         absl::StrCat("the copy could not be read from segment ",
                                      migration.source.segment_name, " (or did not match "
                                      "its checksum) or written to segment ",
                                      migration.destination.segment_name));
      break;
    }
    done = (*ended)[0];
    if (!done.ok() || !move_from.empty()) break;
  }
  // This client's own cached location of the key may name a replica that is gone.
  impl_->ForgetLocations({std::string(key)});
  return done;
}

std::vector<bool> Client::Impl::CopyMigrations(absl::Span<const client::Migration> batch,
                                               std::string& buffer) {
  const size_t n = batch.size();
  std::vector<bool> copied(n, false);
  uint64_t total = 0;
  for (const client::Migration& migration : batch) total += migration.size;
  if (buffer.size() < total) buffer.resize(total);
  // One op per copy, for the read (from the source) or the write (to the destination).
  auto ops_for = [&](wire::Opcode opcode, const std::vector<bool>& wanted,
                     std::vector<size_t>& owners) {
    std::vector<TransferOp> ops;
    uint64_t offset = 0;
    for (size_t i = 0; i < n; ++i) {
      const client::Migration& migration = batch[i];
      char* bytes = buffer.data() + offset;
      offset += migration.size;
      if (!wanted[i]) continue;
      ops.push_back(OpFor(opcode,
                          opcode == wire::Opcode::kRead ? migration.source : migration.destination,
                          {iovec{bytes, migration.size}}));
      ops.back().hash = opcode == wire::Opcode::kRead && migration.checksum != 0;
      owners.push_back(i);
    }
    return ops;
  };
  std::vector<size_t> readers;
  std::vector<TransferOp> reads = ops_for(wire::Opcode::kRead, std::vector<bool>(n, true), readers);
  transport->Execute(absl::MakeSpan(reads), TransferDeadline());
  std::vector<bool> intact(n, false);
  for (size_t r = 0; r < reads.size(); ++r) {
    const client::Migration& migration = batch[readers[r]];
    // A copy that does not match the checksum the writer gave would spread corruption.
    intact[readers[r]] =
        reads[r].status.ok() &&
        (migration.checksum == 0 ||
         (reads[r].checksum.has_value() ? *reads[r].checksum : wire::Checksum(reads[r].iov)) ==
             migration.checksum);
  }
  std::vector<size_t> writers;
  std::vector<TransferOp> writes = ops_for(wire::Opcode::kWrite, intact, writers);
  transport->Execute(absl::MakeSpan(writes), TransferDeadline());
  for (size_t w = 0; w < writes.size(); ++w) copied[writers[w]] = writes[w].status.ok();
  return copied;
}

}  // namespace kvpool
