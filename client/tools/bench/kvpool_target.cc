#include "client/tools/bench/kvpool_target.h"

#include <algorithm>
#include <cstring>

#include <cstdio>
#include <map>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "client/master_client.h"
#include "client/tools/bench/io.h"
#include "common/size.h"

namespace kvpool::bench {
namespace {

constexpr uint64_t kMetaValueSize = 64;
constexpr int kAdminBatch = 256;

std::string WorkingSetPrefix(const Workload& workload) {
  if (workload.kind == WorkloadKind::kMetaExist || workload.kind == WorkloadKind::kMetaLocal) {
    return absl::StrCat("kvb/", workload.run_id, "/meta/");
  }
  return absl::StrCat("kvb/", workload.run_id, "/v", workload.value_size, "/");
}

// Per phase of the client's puts (kvpool_client_put_phase_seconds{phase}): seconds in all,
// calls, and calls over 25 ms, read from the client's metrics text.
struct PhaseTotals {
  double seconds = 0;
  double calls = 0;
  double within_25ms = 0;
};

std::map<std::string, PhaseTotals> PutPhases(const std::string& metrics) {
  std::map<std::string, PhaseTotals> phases;
  const std::string family = "kvpool_client_put_phase_seconds";
  for (absl::string_view line : absl::StrSplit(metrics, '\n')) {
    if (!absl::StartsWith(line, family)) continue;
    size_t at = line.find("phase=\"");
    size_t space = line.rfind(' ');
    if (at == absl::string_view::npos || space == absl::string_view::npos) continue;
    size_t end = line.find('"', at + 7);
    std::string phase(line.substr(at + 7, end - at - 7));
    double value = 0;
    if (!absl::SimpleAtod(line.substr(space + 1), &value)) continue;
    absl::string_view what = line.substr(family.size());
    if (absl::StartsWith(what, "_sum")) phases[phase].seconds = value;
    if (absl::StartsWith(what, "_count")) phases[phase].calls = value;
    if (absl::StartsWith(what, "_bucket") && absl::StrContains(line, "le=\"0.025\"")) {
      phases[phase].within_25ms = value;
    }
  }
  return phases;
}

// The value of the sample `series` (a name with its labels, as exposition text writes it).
double Sample(const std::string& metrics, absl::string_view series) {
  for (absl::string_view line : absl::StrSplit(metrics, '\n')) {
    double value = 0;
    if (absl::StartsWith(line, series) && line.size() > series.size() &&
        line[series.size()] == ' ' && absl::SimpleAtod(line.substr(series.size() + 1), &value)) {
      return value;
    }
  }
  return 0;
}

// Counts a call's per-value results into `result`.
void Tally(const absl::Status& status, uint64_t bytes, OpResult& result) {
  if (status.ok()) {
    ++result.ops;
    result.bytes += bytes;
    return;
  }
  ++result.errors;
  if (result.error.empty()) {
    result.error = absl::StrCat(ErrorCodeName(ToErrorCode(status)), ": ", status.message());
  }
}

// get, put and mixed: one BatchGet or BatchPut per call.
class DataWorker : public Worker {
 public:
  DataWorker(std::shared_ptr<Client> client, const Workload& workload, std::string set_prefix,
             std::string put_prefix, std::atomic<uint64_t>& next_put, bool verify, uint64_t seed)
      : client_(std::move(client)),
        kind_(workload.kind),
        read_fraction_(workload.read_fraction),
        value_size_(workload.value_size),
        keys_(workload.keys),
        set_prefix_(std::move(set_prefix)),
        put_prefix_(std::move(put_prefix)),
        next_put_(next_put),
        get_options_{.verify_checksum = verify},
        ring_(workload.client_buffer_bytes, workload.value_size, workload.batch_size,
              static_cast<uint8_t>(seed)),
        random_(seed),
        gets_(workload.batch_size),
        puts_(workload.batch_size) {
    for (GetItem& item : gets_) item.parts.resize(1);
    for (PutItem& item : puts_) item.parts.resize(1);
  }

  OpResult RunOnce() override {
    bool get = kind_ == WorkloadKind::kGet ||
               (kind_ == WorkloadKind::kMixed && random_.Uniform() < read_fraction_);
    size_t first = ring_.NextUnit();
    OpResult result;
    if (get) {
      for (size_t k = 0; k < gets_.size(); ++k) {
        gets_[k].key = absl::StrCat(set_prefix_, random_.Below(keys_));
        gets_[k].parts[0] = MutableBuffer{ring_.slot(first + k), value_size_};
      }
      std::vector<absl::StatusOr<uint64_t>> got = client_->BatchGet(gets_, get_options_);
      for (const absl::StatusOr<uint64_t>& one : got) {
        Tally(one.status(), one.value_or(0), result);
      }
    } else {
      for (size_t k = 0; k < puts_.size(); ++k) {
        puts_[k].key = absl::StrCat(put_prefix_, next_put_.fetch_add(1, std::memory_order_relaxed));
        puts_[k].parts[0] = ConstBuffer{ring_.slot(first + k), value_size_};
      }
      std::vector<absl::Status> put = client_->BatchPut(puts_);
      for (const absl::Status& one : put) Tally(one, value_size_, result);
    }
    return result;
  }

 private:
  const std::shared_ptr<Client> client_;
  const WorkloadKind kind_;
  const double read_fraction_;
  const uint64_t value_size_;
  const uint64_t keys_;
  const std::string set_prefix_;
  const std::string put_prefix_;
  std::atomic<uint64_t>& next_put_;
  const GetOptions get_options_;
  SlotRing ring_;
  Random random_;
  std::vector<GetItem> gets_;
  std::vector<PutItem> puts_;
};

// meta-put: reserve a batch of new keys, then revoke the reservations (no bytes move).
class ReserveWorker : public Worker {
 public:
  ReserveWorker(std::shared_ptr<client::MasterClient> master, const Workload& workload,
                std::string prefix)
      : master_(std::move(master)), prefix_(std::move(prefix)) {
    start_.sizes.assign(workload.batch_size, workload.value_size);
    start_.replicas = 1;
  }

  OpResult RunOnce() override {
    start_.keys.clear();
    for (size_t k = 0; k < start_.sizes.size(); ++k) {
      start_.keys.push_back(absl::StrCat(prefix_, next_++));
    }
    OpResult result;
    absl::StatusOr<std::vector<client::Reservation>> reserved = master_->BatchPutStart(start_);
    if (!reserved.ok()) {
      Tally(reserved.status(), 0, result);
      result.errors = start_.keys.size();
      return result;
    }
    std::vector<client::PutEnd> revoke;
    size_t reserved_ok = 0;
    for (size_t k = 0; k < reserved->size(); ++k) {
      const client::Reservation& one = (*reserved)[k];
      if (one.put_id != 0) revoke.push_back({.key = start_.keys[k], .put_id = one.put_id});
      if (one.status.ok()) {
        ++reserved_ok;
      } else {
        ++result.errors;
        if (result.error.empty()) {
          result.error = absl::StrCat(ErrorCodeName(ToErrorCode(one.status)), ": ",
                                      one.status.message());
        }
      }
    }
    absl::Status revoked = master_->BatchPutRevoke(revoke);
    for (size_t k = 0; k < reserved_ok; ++k) Tally(revoked, 0, result);
    return result;
  }

 private:
  const std::shared_ptr<client::MasterClient> master_;
  const std::string prefix_;
  client::PutStartRequest start_;
  uint64_t next_ = 0;
};

// meta-exist and meta-local: a lookup of keys of the working set, BatchExist, or
// BatchGetLocal (where their bytes lie in this machine's pools, leased: what an engine's mover
// asks before it copies blocks).
class LookupWorker : public Worker {
 public:
  LookupWorker(std::shared_ptr<Client> client, const Workload& workload, std::string prefix,
               uint64_t seed)
      : client_(std::move(client)),
        local_(workload.kind == WorkloadKind::kMetaLocal),
        keys_(workload.keys),
        prefix_(std::move(prefix)),
        random_(seed),
        batch_(workload.batch_size) {}

  OpResult RunOnce() override {
    for (std::string& key : batch_) key = absl::StrCat(prefix_, random_.Below(keys_));
    OpResult result;
    if (local_) {
      absl::Time expiry;
      for (const absl::StatusOr<LocalValue>& one : client_->BatchGetLocal(batch_, &expiry)) {
        absl::Status status = one.status();
        if (status.ok() && one->size != kMetaValueSize) {
          status = absl::DataLossError("a stored key's local value has the wrong size");
        }
        Tally(status, 0, result);
      }
      return result;
    }
    for (const absl::StatusOr<bool>& one : client_->BatchExist(batch_)) {
      absl::Status status = one.status();
      if (status.ok() && !*one) status = absl::NotFoundError("a stored key does not exist");
      Tally(status, 0, result);
    }
    return result;
  }

 private:
  const std::shared_ptr<Client> client_;
  const bool local_;
  const uint64_t keys_;
  const std::string prefix_;
  Random random_;
  std::vector<std::string> batch_;
};

ClientOptions MakeClientOptions(const KvpoolTargetOptions& options) {
  ClientOptions client = options.credentials;
  client.master_address = options.master;
  client.transport = options.transport;
  client.connections_per_segment = options.connections_per_segment;
  client.verify_checksums = options.verify_checksums;
  client.cache_locations = options.cache_locations;
  client.read_by_key = options.read_by_key;
  return client;
}

}  // namespace

absl::StatusOr<std::unique_ptr<KvpoolTarget>> KvpoolTarget::Connect(
    const KvpoolTargetOptions& options) {
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Create(MakeClientOptions(options));
  if (!client.ok()) return client.status();
  return std::unique_ptr<KvpoolTarget>(
      new KvpoolTarget(options, std::shared_ptr<Client>(std::move(*client))));
}

KvpoolTarget::KvpoolTarget(KvpoolTargetOptions options, std::shared_ptr<Client> client)
    : options_(std::move(options)), client_(std::move(client)) {}

KvpoolTarget::~KvpoolTarget() = default;

std::string KvpoolTarget::Describe(const Workload& workload) const {
  if (IsMetaWorkload(workload.kind)) {
    return absl::StrCat(
        "master gRPC, ", workload.threads,
        options_.shared_client ? " thread(s), one channel" : " thread(s), a channel each");
  }
  // Whether shared memory carried the bytes: the pools the client mapped (auto and shm map
  // same-machine pools that admit it; tcp never does).
  size_t mapped = client_->MappedPools().size();
  return absl::StrCat(
      options_.transport_name, " transport",
      mapped > 0 ? absl::StrCat(" (", mapped, " pool(s) mapped)") : "", ", ", workload.threads,
      options_.shared_client ? " thread(s) sharing a client" : " thread(s), a client each", ", ",
      options_.connections_per_segment, " conn/segment");
}

absl::StatusOr<std::shared_ptr<Client>> KvpoolTarget::ClientForThread() {
  if (options_.shared_client) return client_;
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Create(MakeClientOptions(options_));
  if (!client.ok()) return client.status();
  return std::shared_ptr<Client>(std::move(*client));
}

absl::Status KvpoolTarget::StoreSet(const std::string& prefix, uint64_t count,
                                    uint64_t value_size) {
  int batch = static_cast<int>(std::clamp<uint64_t>((256 << 20) / value_size, 1, kAdminBatch));
  Buffer values(static_cast<size_t>(batch) * value_size, 0x3C);
  std::vector<PutItem> items;
  bool known = false;
  for (const auto& [stored, n] : stored_sets_) known = known || (stored == prefix && n >= count);
  if (!known) stored_sets_.emplace_back(prefix, count);
  for (uint64_t first = 0; first < count; first += batch) {
    items.clear();
    for (uint64_t i = first; i < std::min<uint64_t>(count, first + batch); ++i) {
      // Each value differs (its index in the first bytes), as real KV blocks do.
      uint8_t* value = values.data() + (i - first) * value_size;
      std::memcpy(value, &i, std::min<uint64_t>(sizeof(i), value_size));
      items.push_back(PutItem{absl::StrCat(prefix, i), {ConstBuffer{value, value_size}}});
    }
    // Soft-pinned: the puts of a put or mixed run evict each other, not the values gets read.
    std::vector<absl::Status> results = client_->BatchPut(items, {.pin = PinMode::kSoft});
    for (const absl::Status& status : results) {
      if (status.ok() || absl::IsAlreadyExists(status)) continue;
      return absl::Status(
          status.code(),
          absl::StrCat("cannot store the working set of ", count, " x ", FormatSize(value_size),
                       " (", status.message(), "); a larger pool or fewer --keys?"));
    }
  }
  return absl::OkStatus();
}

absl::Status KvpoolTarget::Prepare(const Workload& workload) {
  put_prefix_ = absl::StrCat("kvb/", workload.run_id, "/p/");
  metrics_before_ = client_->MetricsText();
  switch (workload.kind) {
    case WorkloadKind::kGet:
    case WorkloadKind::kMixed:
      return StoreSet(WorkingSetPrefix(workload), workload.keys, workload.value_size);
    case WorkloadKind::kMetaExist:
    case WorkloadKind::kMetaLocal:
      return StoreSet(WorkingSetPrefix(workload), workload.keys, kMetaValueSize);
    case WorkloadKind::kPut:
    case WorkloadKind::kMetaPut:
      return absl::OkStatus();
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::unique_ptr<Worker>>> KvpoolTarget::MakeWorkers(
    const Workload& workload) {
  while (next_put_.size() < static_cast<size_t>(workload.threads)) {
    next_put_.push_back(std::make_unique<std::atomic<uint64_t>>(0));
    first_kept_.push_back(0);
  }
  std::shared_ptr<client::MasterClient> shared_master;
  std::vector<std::unique_ptr<Worker>> workers;
  for (int t = 0; t < workload.threads; ++t) {
    uint64_t seed = static_cast<uint64_t>(t) * 7919 + 17;
    switch (workload.kind) {
      case WorkloadKind::kGet:
      case WorkloadKind::kPut:
      case WorkloadKind::kMixed: {
        absl::StatusOr<std::shared_ptr<Client>> client = ClientForThread();
        if (!client.ok()) return client.status();
        workers.push_back(std::make_unique<DataWorker>(
            *client, workload, WorkingSetPrefix(workload), absl::StrCat(put_prefix_, t, "/"),
            *next_put_[t], options_.verify_checksums, seed));
        break;
      }
      case WorkloadKind::kMetaExist:
      case WorkloadKind::kMetaLocal: {
        absl::StatusOr<std::shared_ptr<Client>> client = ClientForThread();
        if (!client.ok()) return client.status();
        workers.push_back(
            std::make_unique<LookupWorker>(*client, workload, WorkingSetPrefix(workload), seed));
        break;
      }
      case WorkloadKind::kMetaPut: {
        std::shared_ptr<client::MasterClient> master = shared_master;
        if (master == nullptr) {
          const ClientOptions& creds = options_.credentials;
          ClientTlsOptions tls{.ca_file = creds.tls_ca_file,
                               .cert_file = creds.tls_cert_file,
                               .key_file = creds.tls_key_file,
                               .server_name = creds.tls_server_name};
          absl::StatusOr<std::unique_ptr<MasterLocator>> locator =
              MasterLocator::Create(options_.master, kDefaultEtcdPrefix, tls);
          if (!locator.ok()) return locator.status();
          master = client::MakeGrpcMasterClient(std::move(*locator), absl::Seconds(10), tls,
                                                creds.auth_token);
          if (options_.shared_client) shared_master = master;
        }
        workers.push_back(std::make_unique<ReserveWorker>(
            master, workload, absl::StrCat("kvb/", workload.run_id, "/r/", t, "/")));
        break;
      }
    }
  }
  return workers;
}

void KvpoolTarget::Finish(const Workload& workload) {
  if (workload.kind == WorkloadKind::kGet || workload.kind == WorkloadKind::kMixed) {
    // How the gets found their keys, warm-up included (the shared client's, or the first's).
    std::string after = client_->MetricsText();
    auto delta = [&](absl::string_view series) {
      return static_cast<uint64_t>(Sample(after, series) - Sample(metrics_before_, series));
    };
    std::fprintf(stderr,
                 "kvpool gets: %lu keys read by key (%lu of them not there), %lu kept locations "
                 "used, %lu master lookups\n",
                 delta("kvpool_client_key_reads_total{result=\"hit\"}") +
                     delta("kvpool_client_key_reads_total{result=\"miss\"}"),
                 delta("kvpool_client_key_reads_total{result=\"miss\"}"),
                 delta("kvpool_client_location_cache_hits_total"),
                 delta("kvpool_client_master_lookups_total"));
  }
  if (workload.kind != WorkloadKind::kPut && workload.kind != WorkloadKind::kMixed) return;
  std::map<std::string, PhaseTotals> before = PutPhases(metrics_before_);
  std::string line;
  for (const auto& [phase, after] : PutPhases(client_->MetricsText())) {
    const PhaseTotals& was = before[phase];
    double calls = after.calls - was.calls;
    double slow = calls - (after.within_25ms - was.within_25ms);
    absl::StrAppend(&line, line.empty() ? "" : ", ", phase, " ",
                    absl::StrFormat("%.1f", (after.seconds - was.seconds) * 1e3), " ms (",
                    static_cast<uint64_t>(slow), " of ", static_cast<uint64_t>(calls),
                    " calls over 25 ms)");
  }
  if (!line.empty()) std::fprintf(stderr, "kvpool put phases: %s\n", line.c_str());
  std::vector<std::string> keys;
  for (size_t t = 0; t < next_put_.size(); ++t) {
    uint64_t end = next_put_[t]->load();
    for (uint64_t seq = first_kept_[t]; seq < end; ++seq) {
      keys.push_back(absl::StrCat(put_prefix_, t, "/", seq));
      if (keys.size() == 1024 || seq + 1 == end) {
        (void)client_->BatchRemove(keys, /*force=*/true);
        keys.clear();
      }
    }
    first_kept_[t] = end;
  }
}

void KvpoolTarget::Cleanup() {
  std::vector<std::string> keys;
  for (const auto& [prefix, count] : stored_sets_) {
    for (uint64_t i = 0; i < count; ++i) {
      keys.push_back(absl::StrCat(prefix, i));
      if (keys.size() == 1024 || i + 1 == count) {
        (void)client_->BatchRemove(keys, /*force=*/true);
        keys.clear();
      }
    }
  }
  stored_sets_.clear();
}

}  // namespace kvpool::bench
