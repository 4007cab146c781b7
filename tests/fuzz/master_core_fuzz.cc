// libFuzzer target: the master's core (server/master/master.h) under batches of random RPCs
// from three callers (engines of tenants "a" and "b", and one of the global namespace, their
// keys scoped as the gRPC service scopes them), segments mounting, heartbeating, draining and
// going silent, and time passing. After every step the invariants hold:
//   - no crash, no sanitizer report;
//   - per segment used bytes never exceed its capacity (nor wrap below zero), and the
//     cluster's totals are the sums of its segments';
//   - no object is in two places: an object's replicas are on distinct segments, and no two
//     replicas of any objects overlap on one segment;
//   - no tenant sees another's keys: scoped keys name their caller's tenant, two callers'
//     keys never meet, and a get answers only the size its own caller committed last.

#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "absl/time/time.h"
#include "proto/capability.h"
#include "server/master/auth_policy.h"
#include "server/master/master.h"
#include "server/master/tenant_keys.h"

namespace kvpool::master {
namespace {

constexpr const char* kSegments[] = {"s0", "s1", "s2"};
constexpr uint64_t kSegmentBytes = 1 << 20;

struct Caller {
  Identity identity;
};

class Run {
 public:
  explicit Run(FuzzedDataProvider& in) : in_(in), master_(Options()) {}

  void Go() {
    for (int step = 0; step < 64 && in_.remaining_bytes() > 0; ++step) {
      Step();
      Check();
    }
  }

 private:
  MasterOptions Options() {
    MasterOptions options;
    options.max_key_bytes = 64;
    options.segment_ttl = absl::Seconds(10);
    options.put_timeout = absl::Seconds(30);
    options.lease_ttl = absl::Seconds(5);
    options.clock = [this] { return now_; };
    return options;
  }

  const Identity& PickCaller() {
    static const Identity kCallers[] = {
        {.name = "engine-a", .role = Role::kEngine, .tenant = "a"},
        {.name = "engine-b", .role = Role::kEngine, .tenant = "b"},
        {.name = "engine-g", .role = Role::kEngine, .tenant = ""},
    };
    return kCallers[in_.ConsumeIntegralInRange<int>(0, 2)];
  }

  // Keys as a caller sends them (short, any bytes: the marker too), scoped like the service.
  std::optional<std::vector<std::string>> Keys(const Identity& caller,
                                               std::vector<std::string>* raw_out = nullptr) {
    std::vector<std::string> raw;
    int n = in_.ConsumeIntegralInRange<int>(1, 4);
    for (int i = 0; i < n; ++i) {
      if (in_.ConsumeBool()) {
        raw.push_back(std::string(1, static_cast<char>('k')) +
                      std::to_string(in_.ConsumeIntegralInRange<int>(0, 5)));
      } else {
        raw.push_back(in_.ConsumeRandomLengthString(8));
      }
    }
    std::vector<std::string> keys = raw;
    if (!ScopeKeys(caller, keys).ok()) {
      // Only a global-namespace caller can be refused, and only for a key with the marker.
      bool marker = false;
      for (const std::string& k : raw) marker |= !k.empty() && k[0] == kTenantMarker;
      if (!caller.tenant.empty() || !marker) std::abort();
      return std::nullopt;
    }
    for (size_t i = 0; i < keys.size(); ++i) {
      if (TenantOfKey(keys[i]) != caller.tenant) std::abort();
      auto [it, inserted] = owner_.emplace(keys[i], std::make_pair(caller.tenant, raw[i]));
      if (!inserted && it->second != std::make_pair(caller.tenant, raw[i])) std::abort();
    }
    if (raw_out) *raw_out = raw;
    return keys;
  }

  void Mount(int s) {
    SegmentInfo info;
    info.name = kSegments[s];
    info.host = std::string("host-") + kSegments[s];
    info.endpoint = info.name + ":1";
    info.size = kSegmentBytes;
    info.incarnation = ++incarnation_[s];
    info.token_secret = wire::NewCapabilitySecret();
    if (master_.MountSegment(info).ok()) mounted_.insert(s);
  }

  void Step() {
    switch (in_.ConsumeIntegralInRange<int>(0, 11)) {
      case 0:
        Mount(in_.ConsumeIntegralInRange<int>(0, 2));
        break;
      case 1: {  // put start (and often the commit right after)
        const Identity& caller = PickCaller();
        std::optional<std::vector<std::string>> keys = Keys(caller);
        if (!keys) break;
        std::vector<uint64_t> sizes;
        for (size_t i = 0; i < keys->size(); ++i) {
          sizes.push_back(in_.ConsumeIntegralInRange<uint64_t>(0, 1 << 17));
        }
        uint32_t replicas = in_.ConsumeIntegralInRange<uint32_t>(1, 3);
        absl::StatusOr<std::vector<PutStartResult>> started =
            master_.BatchPutStart(*keys, sizes, {.replica_num = replicas, .owner = caller.name});
        if (!started.ok() || started->size() != keys->size()) std::abort();
        for (size_t i = 0; i < keys->size(); ++i) {
          const PutStartResult& r = (*started)[i];
          if (!r.status.ok()) continue;
          std::set<std::string> on;
          for (const PlacementView& p : r.placements) {
            if (!on.insert(p.segment_name).second) std::abort();  // two replicas, one segment
          }
          pending_.push_back({(*keys)[i], r.put_id, sizes[i], caller.name});
        }
        if (in_.ConsumeBool()) Commit();
        break;
      }
      case 2:
        Commit();
        break;
      case 3: {  // revoke a pending put
        if (pending_.empty()) break;
        size_t i = in_.ConsumeIntegralInRange<size_t>(0, pending_.size() - 1);
        master_.BatchPutRevoke({PutRef{.key = pending_[i].key, .put_id = pending_[i].put_id,
                                       .caller = pending_[i].owner}});
        pending_.erase(pending_.begin() + i);
        break;
      }
      case 4:
      case 5: {  // get
        const Identity& caller = PickCaller();
        std::optional<std::vector<std::string>> keys = Keys(caller);
        if (!keys) break;
        std::vector<GetResult> got = master_.BatchGetReplicaList(*keys);
        if (got.size() != keys->size()) std::abort();
        for (size_t i = 0; i < keys->size(); ++i) {
          if (!got[i].status.ok()) continue;
          auto it = committed_.find((*keys)[i]);
          // Only what this caller's tenant committed under this key, at the size committed.
          if (it == committed_.end() || it->second.count(got[i].size) == 0) std::abort();
        }
        break;
      }
      case 6: {  // exist
        const Identity& caller = PickCaller();
        std::optional<std::vector<std::string>> keys = Keys(caller);
        if (!keys) break;
        std::vector<absl::StatusOr<bool>> exist = master_.BatchExist(*keys);
        for (size_t i = 0; i < keys->size(); ++i) {
          if (exist[i].ok() && *exist[i] && !committed_.contains((*keys)[i])) std::abort();
        }
        break;
      }
      case 7: {  // remove
        const Identity& caller = PickCaller();
        std::optional<std::vector<std::string>> keys = Keys(caller);
        if (!keys) break;
        master_.BatchRemove(*keys, in_.ConsumeBool());
        break;
      }
      case 8:
        if (in_.ConsumeIntegralInRange<int>(0, 7) == 0) master_.RemoveAll(in_.ConsumeBool());
        break;
      case 9: {  // heartbeats of the mounted segments, applying their manifests
        for (int s : mounted_) {
          if (std::optional<SegmentId> id =
                  master_.Heartbeat(kSegments[s], incarnation_[s]).segment) {
            master_.manifest_sync().Sync(*id, std::numeric_limits<uint64_t>::max(), 0);
          }
        }
        break;
      }
      case 10: {  // a segment drains, unmounts or falls silent
        int s = in_.ConsumeIntegralInRange<int>(0, 2);
        switch (in_.ConsumeIntegralInRange<int>(0, 2)) {
          case 0:
            master_.DrainSegment(kSegments[s]).IgnoreError();
            master_.FinishDrains();
            break;
          case 1:
            master_.UnmountSegment(kSegments[s], incarnation_[s]).IgnoreError();
            mounted_.erase(s);
            break;
          default:
            mounted_.erase(s);  // no more heartbeats from it
        }
        break;
      }
      default:  // time passes; the master's background work runs
        now_ += absl::Milliseconds(in_.ConsumeIntegralInRange<int>(0, 20000));
        master_.ExpireSegments();
        master_.ReclaimExpiredReservations();
        master_.EvictIfAboveHighWatermark();
        master_.FinishDrains();
    }
  }

  void Commit() {
    if (pending_.empty()) return;
    size_t n = in_.ConsumeIntegralInRange<size_t>(1, pending_.size());
    std::vector<PutRef> refs;
    std::vector<Pending> taken(pending_.begin(), pending_.begin() + n);
    pending_.erase(pending_.begin(), pending_.begin() + n);
    for (const Pending& p : taken) {
      refs.push_back({.key = p.key, .put_id = p.put_id, .caller = p.owner});
      // A commit may answer OK only for a size that was started under the key.
      committed_[p.key].insert(p.size);
    }
    master_.BatchPutEnd(refs);
  }

  void Check() {
    ClusterSummary summary = master_.GetClusterSummary();
    uint64_t used = 0, capacity = 0;
    for (const SegmentSummary& s : summary.segments) {
      if (s.used_bytes > s.capacity_bytes) std::abort();  // over capacity, or wrapped below 0
      used += s.used_bytes;
      capacity += s.capacity_bytes;
    }
    if (used != summary.used_bytes || capacity != summary.capacity_bytes) std::abort();
    // Every key any caller named: replicas distinct and disjoint everywhere.
    std::vector<std::string> keys;
    for (const auto& [key, who] : owner_) keys.push_back(key);
    if (keys.empty()) return;
    std::map<std::pair<std::string, uint64_t>, std::vector<std::pair<uint64_t, uint64_t>>> ranges;
    for (const GetResult& got : master_.BatchGetReplicaList(keys)) {
      if (!got.status.ok()) continue;
      std::set<std::string> on;
      for (const PlacementView& p : got.replicas) {
        if (!on.insert(p.segment_name).second) std::abort();
        ranges[{p.segment_name, p.incarnation}].push_back({p.offset, p.offset + p.length});
      }
    }
    for (auto& [segment, list] : ranges) {
      std::sort(list.begin(), list.end());
      for (size_t i = 1; i < list.size(); ++i) {
        if (list[i].first < list[i - 1].second) std::abort();  // two objects, one range
      }
    }
  }

  struct Pending {
    std::string key;
    uint64_t put_id;
    uint64_t size;
    std::string owner;
  };

  FuzzedDataProvider& in_;
  absl::Time now_ = absl::FromUnixSeconds(1'000'000);
  Master master_;
  uint64_t incarnation_[3] = {0, 0, 0};
  std::set<int> mounted_;
  std::vector<Pending> pending_;
  // Stored key -> (tenant, key as sent): two callers' keys never meet.
  std::map<std::string, std::pair<std::string, std::string>> owner_;
  // Stored key -> sizes committed under it (a get answers one of them).
  std::map<std::string, std::set<uint64_t>> committed_;
};

}  // namespace
}  // namespace kvpool::master

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  kvpool::master::Run run(in);
  run.Go();
  return 0;
}
