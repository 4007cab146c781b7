// The client's own logic (location cache, put pipeline, retries, drain mover, segment
// directory) against a fake master (FakeMaster: objects, reservations and drains in memory)
// and a fake data plane (FakeSegments: one byte array per segment endpoint), no sockets.
// The same logic against real processes: tests/pool_test.cc, tests/transport_test.cc.

#include <atomic>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "client/client_builder.h"
#include "client/master_client.h"
#include "client/segment_directory.h"
#include "client/transport.h"
#include "gtest/gtest.h"
#include "kvpool/client.h"
#include "proto/checksum.h"
#include "proto/error_codes.h"

namespace kvpool {
namespace {

using client::Location;
using client::MasterClient;
using client::Placement;
using client::Reservation;

constexpr uint64_t kPoolBytes = 1 << 20;

// Segment pools in memory; ops on an endpoint in `failing` fail TRANSFER_FAIL.
class FakeSegments {
 public:
  void Execute(absl::Span<client::TransferOp> ops) {
    absl::MutexLock lock(&mu_);
    ++executes_;
    for (client::TransferOp& op : ops) {
      ++ops_;
      if (failing_.count(op.endpoint) > 0) {
        op.status = ErrorStatus(ErrorCode::TRANSFER_FAIL, "segment unreachable (fake)");
        continue;
      }
      std::string& pool = pools_[op.endpoint];
      pool.resize(kPoolBytes);
      uint64_t at = op.offset;
      for (const iovec& part : op.iov) {
        if (op.opcode == wire::Opcode::kWrite) {
          std::memcpy(pool.data() + at, part.iov_base, part.iov_len);
        } else {
          std::memcpy(part.iov_base, pool.data() + at, part.iov_len);
          if (corrupt_reads_) static_cast<char*>(part.iov_base)[0] ^= 1;
        }
        at += part.iov_len;
      }
      op.status = absl::OkStatus();
    }
  }
  void Fail(const std::string& endpoint) {
    absl::MutexLock lock(&mu_);
    failing_[endpoint] = true;
  }
  void CorruptReads() {
    absl::MutexLock lock(&mu_);
    corrupt_reads_ = true;
  }
  std::string Bytes(const std::string& endpoint, uint64_t offset, uint64_t length) {
    absl::MutexLock lock(&mu_);
    std::string& pool = pools_[endpoint];
    pool.resize(kPoolBytes);
    return pool.substr(offset, length);
  }
  int executes() {
    absl::MutexLock lock(&mu_);
    return executes_;
  }

 private:
  absl::Mutex mu_;
  std::map<std::string, std::string> pools_;
  std::map<std::string, bool> failing_;
  bool corrupt_reads_ = false;
  int executes_ = 0;
  int ops_ = 0;
};

class FakeTransport final : public client::Transport {
 public:
  // How it answers HashesWrite, and whether it then hashes the writes asked (as TCP does) or
  // leaves them unhashed (as a transport that took them elsewhere would).
  enum class WriteHashing { kNone, kHashes, kSaysSoButDoesNot };

  explicit FakeTransport(std::shared_ptr<FakeSegments> segments,
                         WriteHashing hashing = WriteHashing::kNone)
      : segments_(std::move(segments)), hashing_(hashing) {}
  void Execute(absl::Span<client::TransferOp> ops, absl::Time) override {
    for (client::TransferOp& op : ops) {
      if (op.opcode != wire::Opcode::kWrite || !op.hash) continue;
      ++hashed_writes_;
      if (hashing_ == WriteHashing::kHashes) op.checksum = wire::Checksum(op.iov);
    }
    segments_->Execute(ops);
  }
  bool HashesWrite(const client::TransferOp&) override { return hashing_ != WriteHashing::kNone; }
  // Writes that came with `hash` set.
  int hashed_writes() const { return hashed_writes_.load(); }

 private:
  std::shared_ptr<FakeSegments> segments_;
  const WriteHashing hashing_;
  std::atomic<int> hashed_writes_{0};
};

// The master's bookkeeping, as little of it as the client's logic needs: a bump allocator
// per segment, reservations, committed objects with their replicas and checksums, a drain
// plan. Knobs make it fail in the ways the client must handle.
class FakeMaster final : public MasterClient {
 public:
  struct Object {
    uint64_t size = 0;
    uint64_t checksum = 0;
    std::vector<Placement> replicas;
  };

  explicit FakeMaster(std::vector<client::SegmentEntry> segments)
      : segments_(std::move(segments)) {}

  // Knobs.
  absl::Duration lease = absl::Seconds(10);
  std::atomic<bool> unavailable{false};     // every call fails RPC_FAIL
  std::atomic<int> write_fails{0};          // this many commits answer WRITE_FAIL first
  std::atomic<int> list_delay_ms{0};        // ListSegments takes this long

  // Counters.
  std::atomic<int> lookups{0};
  std::atomic<int> starts{0};
  std::atomic<int> ends{0};
  std::atomic<int> lists{0};
  std::vector<uint64_t> revoked;

  absl::Status WaitForMaster(absl::Duration) override { return absl::OkStatus(); }

  absl::StatusOr<std::vector<Reservation>> BatchPutStart(
      const client::PutStartRequest& request) override {
    ++starts;
    if (unavailable) return Unavailable();
    absl::MutexLock lock(&mu_);
    std::vector<Reservation> out;
    for (size_t i = 0; i < request.keys.size(); ++i) {
      Reservation r;
      if (objects_.count(request.keys[i]) > 0) {
        r.status = ErrorStatus(ErrorCode::OBJECT_ALREADY_EXISTS, "exists");
        out.push_back(r);
        continue;
      }
      r.put_id = next_put_id_++;
      r.deadline = absl::Now() + absl::Seconds(30);
      for (uint32_t k = 0; k < request.replicas && k < segments_.size(); ++k) {
        r.placements.push_back(Allocate(segments_[k], request.sizes[i]));
      }
      pending_[r.put_id] = {request.keys[i], Object{request.sizes[i], 0, r.placements}};
      out.push_back(r);
    }
    return out;
  }

  absl::StatusOr<std::vector<absl::Status>> BatchPutEnd(
      absl::Span<const client::PutEnd> items) override {
    ++ends;
    if (unavailable) return Unavailable();
    absl::MutexLock lock(&mu_);
    std::vector<absl::Status> out;
    for (const client::PutEnd& item : items) {
      auto it = pending_.find(item.put_id);
      if (it == pending_.end()) {
        out.push_back(ErrorStatus(ErrorCode::OBJECT_NOT_FOUND, "no such reservation"));
        continue;
      }
      Object object = it->second.second;
      object.checksum = item.checksum;
      objects_[item.key] = object;  // committed, if not yet durable
      if (write_fails > 0) {
        --write_fails;
        out.push_back(ErrorStatus(ErrorCode::WRITE_FAIL, "manifest not durable (fake)"));
        continue;
      }
      pending_.erase(it);
      out.push_back(absl::OkStatus());
    }
    return out;
  }

  absl::Status BatchPutRevoke(absl::Span<const client::PutEnd> items) override {
    absl::MutexLock lock(&mu_);
    for (const client::PutEnd& item : items) {
      revoked.push_back(item.put_id);
      pending_.erase(item.put_id);
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::vector<Location>> BatchGetReplicaList(
      absl::Span<const std::string> keys, const client::LocateOptions&) override {
    ++lookups;
    if (unavailable) return Unavailable();
    absl::MutexLock lock(&mu_);
    absl::Time now = absl::Now();
    std::vector<Location> out;
    for (const std::string& key : keys) {
      Location location;
      auto it = objects_.find(key);
      if (it == objects_.end()) {
        location.status = ErrorStatus(ErrorCode::OBJECT_NOT_FOUND, "no such key");
      } else {
        location.size = it->second.size;
        location.checksum = it->second.checksum;
        location.lease = lease;
        location.lease_expiry = now + lease;
        location.replicas = it->second.replicas;
      }
      out.push_back(location);
    }
    return out;
  }

  absl::StatusOr<std::vector<absl::StatusOr<bool>>> BatchExist(
      absl::Span<const std::string> keys) override {
    absl::MutexLock lock(&mu_);
    std::vector<absl::StatusOr<bool>> out;
    for (const std::string& key : keys) out.push_back(objects_.count(key) > 0);
    return out;
  }
  std::vector<absl::Status> BatchRemove(absl::Span<const std::string> keys, bool) override {
    absl::MutexLock lock(&mu_);
    std::vector<absl::Status> out;
    for (const std::string& key : keys) {
      out.push_back(objects_.erase(key) > 0
                        ? absl::OkStatus()
                        : ErrorStatus(ErrorCode::OBJECT_NOT_FOUND, "no such key"));
    }
    return out;
  }
  std::vector<absl::Status> BatchDropReplicas(absl::Span<const std::string> keys,
                                              absl::string_view, bool) override {
    return std::vector<absl::Status>(keys.size(), absl::UnimplementedError("fake"));
  }
  absl::StatusOr<uint64_t> RemoveAll(bool, absl::string_view) override {
    absl::MutexLock lock(&mu_);
    uint64_t n = objects_.size();
    objects_.clear();
    return n;
  }
  absl::StatusOr<ClusterStatus> GetClusterStatus() override { return ClusterStatus{}; }
  absl::StatusOr<client::SegmentList> ListSegments() override {
    ++lists;
    if (unavailable) return Unavailable();
    if (list_delay_ms > 0) absl::SleepFor(absl::Milliseconds(list_delay_ms.load()));
    absl::MutexLock lock(&mu_);
    return client::SegmentList{.segments = segments_};
  }

  // Drains: every object with a replica on `segment` is moved to the next segment.
  absl::Status DrainSegment(absl::string_view name, bool) override {
    absl::MutexLock lock(&mu_);
    draining_ = std::string(name);
    return absl::OkStatus();
  }
  absl::StatusOr<client::MigrationBatch> MigrateStart(absl::string_view segment, uint32_t,
                                                      uint64_t) override {
    absl::MutexLock lock(&mu_);
    client::MigrationBatch batch;
    if (!migrations_.empty()) return batch;  // one round, then done
    const client::SegmentEntry* target = nullptr;
    for (const client::SegmentEntry& s : segments_) {
      if (s.name != segment) target = &s;
    }
    for (auto& [key, object] : objects_) {
      for (const Placement& replica : object.replicas) {
        if (replica.segment_name != segment) continue;
        client::Migration m{.key = key,
                            .migration_id = next_put_id_++,
                            .size = object.size,
                            .checksum = object.checksum,
                            .source = replica,
                            .destination = Allocate(*target, object.size)};
        migrations_[m.migration_id] = m;
        batch.migrations.push_back(m);
      }
    }
    return batch;
  }
  absl::StatusOr<std::vector<absl::Status>> MigrateEnd(
      absl::Span<const client::MigrationEnd> items) override {
    absl::MutexLock lock(&mu_);
    std::vector<absl::Status> out;
    for (const client::MigrationEnd& end : items) {
      ended_.push_back(end);
      if (end.copied) objects_[end.key].replicas = {migrations_[end.migration_id].destination};
      out.push_back(absl::OkStatus());
    }
    return out;
  }
  absl::StatusOr<client::CopyStart> ReplicaCopyStart(absl::string_view,
                                                     absl::Span<const std::string>,
                                                     absl::string_view, bool) override {
    return absl::UnimplementedError("fake");
  }
  absl::StatusOr<std::vector<absl::Status>> ReplicaCopyEnd(
      absl::Span<const client::MigrationEnd>) override {
    return absl::UnimplementedError("fake");
  }

  // Test access.
  uint64_t Checksum(const std::string& key) {
    absl::MutexLock lock(&mu_);
    return objects_[key].checksum;
  }
  void Corrupt(const std::string& key) {
    absl::MutexLock lock(&mu_);
    objects_[key].checksum ^= 1;
  }
  // Moves the key's only replica elsewhere (as another client's drain would), keeping bytes.
  Placement Replica(const std::string& key, size_t i = 0) {
    absl::MutexLock lock(&mu_);
    return objects_[key].replicas.at(i);
  }
  void SetReplicas(const std::string& key, std::vector<Placement> replicas) {
    absl::MutexLock lock(&mu_);
    objects_[key].replicas = std::move(replicas);
  }
  std::vector<client::MigrationEnd> ended() {
    absl::MutexLock lock(&mu_);
    return ended_;
  }
  Placement Allocate(const std::string& segment_name, uint64_t size) {
    absl::MutexLock lock(&mu_);
    for (const client::SegmentEntry& s : segments_) {
      if (s.name == segment_name) return Allocate(s, size);
    }
    return {};
  }

 private:
  static absl::Status Unavailable() {
    return ErrorStatus(ErrorCode::RPC_FAIL, "no master (fake)");
  }
  Placement Allocate(const client::SegmentEntry& segment, uint64_t size)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    uint64_t& next = next_offset_[segment.name];
    Placement p{.segment_name = segment.name,
                .endpoint = segment.endpoint,
                .host = segment.host,
                .incarnation = 1,
                .offset = next,
                .length = size};
    next += (size + 63) / 64 * 64;
    return p;
  }

  absl::Mutex mu_;
  std::vector<client::SegmentEntry> segments_;
  std::map<std::string, uint64_t> next_offset_;
  std::map<uint64_t, std::pair<std::string, Object>> pending_;
  std::map<std::string, Object> objects_;
  std::map<uint64_t, client::Migration> migrations_;
  std::vector<client::MigrationEnd> ended_;
  std::string draining_;
  uint64_t next_put_id_ = 1;
};

std::vector<client::SegmentEntry> TwoRemoteSegments() {
  return {{.name = "seg-a", .endpoint = "10.0.0.1:7001", .host = "node-a",
           .machine_id = "machine-a"},
          {.name = "seg-b", .endpoint = "10.0.0.2:7001", .host = "node-b",
           .machine_id = "machine-b"}};
}

class ClientTest : public ::testing::Test {
 protected:
  void SetUp() override { Build(ClientOptions{}); }

  void Build(ClientOptions options,
             FakeTransport::WriteHashing hashing = FakeTransport::WriteHashing::kNone) {
    client_.reset();
    options.transport = TransportKind::kTcp;
    options.local_host = "client-host";
    auto master = std::make_unique<FakeMaster>(TwoRemoteSegments());
    master_ = master.get();
    segments_ = std::make_shared<FakeSegments>();
    auto transport = std::make_unique<FakeTransport>(segments_, hashing);
    transport_ = transport.get();
    absl::StatusOr<std::unique_ptr<Client>> client =
        ClientBuilder::Build(options, std::move(master), std::move(transport));
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = *std::move(client);
  }

  std::string GetOrDie(const std::string& key) {
    absl::StatusOr<std::string> value = client_->Get(key);
    EXPECT_TRUE(value.ok()) << key << ": " << value.status();
    return value.value_or("");
  }

  FakeMaster* master_ = nullptr;
  FakeTransport* transport_ = nullptr;
  std::shared_ptr<FakeSegments> segments_;
  std::unique_ptr<Client> client_;
};

TEST_F(ClientTest, BatchPutGathersPartsAndGetScattersThemBack) {
  std::string a = "first value", b1 = "second ", b2 = "value in two parts";
  std::vector<PutItem> items = {
      {"a", {ConstBuffer{a.data(), a.size()}}},
      {"b", {ConstBuffer{b1.data(), b1.size()}, ConstBuffer{b2.data(), b2.size()}}}};
  std::vector<absl::Status> put = client_->BatchPut(items);
  ASSERT_TRUE(put[0].ok()) << put[0];
  ASSERT_TRUE(put[1].ok()) << put[1];
  // One reservation and one commit for the batch, and one data-plane round for its bytes.
  EXPECT_EQ(master_->starts.load(), 1);
  EXPECT_EQ(master_->ends.load(), 1);
  EXPECT_EQ(segments_->executes(), 1);
  // The bytes landed where the master placed them, and the commit carried their checksum.
  Placement where = master_->Replica("b");
  EXPECT_EQ(segments_->Bytes(where.endpoint, where.offset, where.length), b1 + b2);

  std::string out_a(a.size(), '\0'), out_b1(4, '\0'), out_b2(b1.size() + b2.size() - 4, '\0');
  std::vector<GetItem> gets = {
      {"a", {MutableBuffer{out_a.data(), out_a.size()}}},
      {"b", {MutableBuffer{out_b1.data(), out_b1.size()},
             MutableBuffer{out_b2.data(), out_b2.size()}}}};
  std::vector<absl::StatusOr<uint64_t>> got = client_->BatchGet(gets);
  ASSERT_TRUE(got[0].ok()) << got[0].status();
  ASSERT_TRUE(got[1].ok()) << got[1].status();
  EXPECT_EQ(*got[1], b1.size() + b2.size());
  EXPECT_EQ(out_a, a);
  EXPECT_EQ(out_b1 + out_b2, b1 + b2);
  EXPECT_EQ(master_->lookups.load(), 1);  // one lookup for the batch
}

// Each value's checksum is taken once, by the transport where it says it hashes writes (on
// the first replica only), else by the client; the commit carries the same checksum either way.
TEST_F(ClientTest, ACommitCarriesTheChecksumWhoeverHashedTheValue) {
  std::string a = "first value", b1 = "second ", b2 = "value in two parts";
  iovec b_parts[] = {{b1.data(), b1.size()}, {b2.data(), b2.size()}};
  const uint64_t sum_b = wire::Checksum(b_parts);
  for (auto hashing : {FakeTransport::WriteHashing::kNone, FakeTransport::WriteHashing::kHashes,
                       FakeTransport::WriteHashing::kSaysSoButDoesNot}) {
    SCOPED_TRACE(static_cast<int>(hashing));
    Build(ClientOptions{}, hashing);
    std::vector<PutItem> items = {
        {"a", {ConstBuffer{a.data(), a.size()}}},
        {"b", {ConstBuffer{b1.data(), b1.size()}, ConstBuffer{b2.data(), b2.size()}}}};
    PutOptions options;
    options.replicas = 2;
    std::vector<absl::Status> put = client_->BatchPut(items, options);
    ASSERT_TRUE(put[0].ok()) << put[0];
    ASSERT_TRUE(put[1].ok()) << put[1];
    EXPECT_EQ(transport_->hashed_writes(), hashing == FakeTransport::WriteHashing::kNone ? 0 : 2);
    EXPECT_EQ(master_->Checksum("b"), sum_b);
    EXPECT_EQ(GetOrDie("b"), b1 + b2);
  }
}

TEST_F(ClientTest, ReplicasGoToDistinctSegments) {
  PutOptions options;
  options.replicas = 2;
  ASSERT_TRUE(client_->Put("k", "twice", options).ok());
  EXPECT_NE(master_->Replica("k", 0).endpoint, master_->Replica("k", 1).endpoint);
  for (size_t i = 0; i < 2; ++i) {
    Placement p = master_->Replica("k", i);
    EXPECT_EQ(segments_->Bytes(p.endpoint, p.offset, p.length), "twice");
  }
}

TEST_F(ClientTest, RepeatedGetsAreServedFromTheLocationCache) {
  ASSERT_TRUE(client_->Put("k", "cached").ok());
  EXPECT_EQ(GetOrDie("k"), "cached");
  EXPECT_EQ(GetOrDie("k"), "cached");
  EXPECT_EQ(GetOrDie("k"), "cached");
  EXPECT_EQ(master_->lookups.load(), 1);
  EXPECT_NE(client_->MetricsText().find("kvpool_client_location_cache_hits_total 2"),
            std::string::npos)
      << client_->MetricsText();
}

TEST_F(ClientTest, WithoutTheCacheEveryGetAsksTheMaster) {
  ClientOptions options;
  options.cache_locations = false;
  Build(options);
  ASSERT_TRUE(client_->Put("k", "uncached").ok());
  EXPECT_EQ(GetOrDie("k"), "uncached");
  EXPECT_EQ(GetOrDie("k"), "uncached");
  EXPECT_EQ(master_->lookups.load(), 2);
}

TEST_F(ClientTest, ACachedLocationIsRenewedOnceLessThanTheMarginIsLeft) {
  // A lease of 2.3 s is cached while more than 2 s (kCacheMargin) of it is left.
  master_->lease = absl::Milliseconds(2300);
  ASSERT_TRUE(client_->Put("k", "renewed").ok());
  EXPECT_EQ(GetOrDie("k"), "renewed");
  EXPECT_EQ(GetOrDie("k"), "renewed");
  EXPECT_EQ(master_->lookups.load(), 1);
  absl::SleepFor(absl::Milliseconds(400));
  EXPECT_EQ(GetOrDie("k"), "renewed");
  EXPECT_EQ(master_->lookups.load(), 2);
}

TEST_F(ClientTest, ACachedLocationRidesOutAMasterThatCannotAnswer) {
  master_->lease = absl::Milliseconds(2300);
  ASSERT_TRUE(client_->Put("k", "fail-over").ok());
  EXPECT_EQ(GetOrDie("k"), "fail-over");
  absl::SleepFor(absl::Milliseconds(400));  // due for renewal, 1.9 s of lease left
  master_->unavailable = true;
  EXPECT_EQ(GetOrDie("k"), "fail-over");
  EXPECT_EQ(master_->lookups.load(), 2);  // it asked, and read where the cache said
  // A key never located fails with the master's failure.
  absl::StatusOr<std::string> other = client_->Get("other");
  EXPECT_EQ(ToErrorCode(other.status()), ErrorCode::RPC_FAIL) << other.status();
}

TEST_F(ClientTest, AFailedCachedLocationIsForgottenAndAskedAgain) {
  ASSERT_TRUE(client_->Put("k", "moved").ok());
  EXPECT_EQ(GetOrDie("k"), "moved");
  // The object moves to seg-b (another client's drain) and seg-a goes away.
  Placement old = master_->Replica("k");
  Placement moved = master_->Allocate("seg-b", old.length);
  client::TransferOp copy{.opcode = wire::Opcode::kWrite, .endpoint = moved.endpoint,
                          .offset = moved.offset, .length = moved.length};
  std::string bytes = segments_->Bytes(old.endpoint, old.offset, old.length);
  copy.iov = {iovec{bytes.data(), bytes.size()}};
  segments_->Execute(absl::MakeSpan(&copy, 1));
  master_->SetReplicas("k", {moved});
  segments_->Fail(old.endpoint);
  EXPECT_EQ(GetOrDie("k"), "moved");
  EXPECT_EQ(master_->lookups.load(), 2);
  EXPECT_EQ(GetOrDie("k"), "moved");  // the new location is cached
  EXPECT_EQ(master_->lookups.load(), 2);
}

TEST_F(ClientTest, AReadFailsOverToTheNextReplica) {
  PutOptions options;
  options.replicas = 2;
  ASSERT_TRUE(client_->Put("k", "two copies", options).ok());
  segments_->Fail(master_->Replica("k", 0).endpoint);
  EXPECT_EQ(GetOrDie("k"), "two copies");
  segments_->Fail(master_->Replica("k", 1).endpoint);
  // The cached location fails, is forgotten, and the master's fresh answer fails too.
  absl::StatusOr<std::string> none = client_->Get("k");
  EXPECT_EQ(ToErrorCode(none.status()), ErrorCode::TRANSFER_FAIL) << none.status();
  EXPECT_EQ(master_->lookups.load(), 2);
}

TEST_F(ClientTest, BytesThatDoNotMatchTheChecksumAreNeverReturned) {
  ASSERT_TRUE(client_->Put("k", "checked").ok());
  master_->Corrupt("k");
  absl::StatusOr<std::string> value = client_->Get("k");
  EXPECT_EQ(ToErrorCode(value.status()), ErrorCode::CHECKSUM_MISMATCH) << value.status();
}

TEST_F(ClientTest, ACommitThatWasNotDurableIsRetried) {
  master_->write_fails = 2;
  ASSERT_TRUE(client_->Put("k", "durable").ok());
  EXPECT_EQ(master_->ends.load(), 3);
  EXPECT_EQ(GetOrDie("k"), "durable");
}

TEST_F(ClientTest, ACommitNeverDurableFailsWriteFailAfterThreeTries) {
  master_->write_fails = 100;
  absl::Status put = client_->Put("k", "never durable");
  EXPECT_EQ(ToErrorCode(put), ErrorCode::WRITE_FAIL) << put;
  EXPECT_EQ(master_->ends.load(), 3);
}

TEST_F(ClientTest, AFailedWriteIsRevokedNotCommitted) {
  segments_->Fail("10.0.0.1:7001");
  std::string ok = "fine";
  std::vector<PutItem> items = {{"k", {ConstBuffer{ok.data(), ok.size()}}}};
  absl::Status put = client_->BatchPut(items)[0];
  EXPECT_EQ(ToErrorCode(put), ErrorCode::TRANSFER_FAIL) << put;
  EXPECT_EQ(master_->ends.load(), 0);
  EXPECT_EQ(master_->revoked.size(), 1u);
  EXPECT_EQ(ToErrorCode(client_->Get("k").status()), ErrorCode::OBJECT_NOT_FOUND);
}

TEST_F(ClientTest, ADeduplicatedPutWritesNothing) {
  ASSERT_TRUE(client_->Put("k", "first").ok());
  absl::Status again = client_->Put("k", "second");
  EXPECT_TRUE(absl::IsAlreadyExists(again)) << again;
  EXPECT_EQ(master_->ends.load(), 1);
  EXPECT_TRUE(master_->revoked.empty());
  EXPECT_EQ(GetOrDie("k"), "first");
}

TEST_F(ClientTest, ARemoveForgetsTheCachedLocation) {
  ASSERT_TRUE(client_->Put("k", "gone").ok());
  EXPECT_EQ(GetOrDie("k"), "gone");
  ASSERT_TRUE(client_->Remove("k").ok());
  EXPECT_EQ(ToErrorCode(client_->Get("k").status()), ErrorCode::OBJECT_NOT_FOUND);
}

TEST_F(ClientTest, SmallBuffersAreRefusedBeforeAnyRead) {
  ASSERT_TRUE(client_->Put("k", "twelve bytes").ok());
  int executes = segments_->executes();
  std::string small(4, '\0');
  absl::StatusOr<uint64_t> got =
      client_->Get("k", {MutableBuffer{small.data(), small.size()}});
  EXPECT_EQ(ToErrorCode(got.status()), ErrorCode::BUFFER_OVERFLOW) << got.status();
  EXPECT_EQ(segments_->executes(), executes);  // nothing was read
}

TEST_F(ClientTest, TheDrainMoverCopiesEachObjectAndReportsWhatMoved) {
  std::vector<std::string> values = {"one", "two two", "three three three"};
  for (size_t i = 0; i < values.size(); ++i) {
    ASSERT_TRUE(client_->Put(absl::StrCat("k", i), values[i]).ok());
  }
  // k1's bytes no longer match its checksum: its copy must not be made.
  master_->Corrupt("k1");
  std::vector<DrainReport> progress;
  DrainOptions options;
  options.progress = [&](const DrainReport& report) { progress.push_back(report); };
  absl::StatusOr<DrainReport> report = client_->DrainSegment("seg-a", options);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->moved_objects, 2u);
  EXPECT_EQ(report->failed_copies, 1u);
  EXPECT_EQ(report->moved_bytes, values[0].size() + values[2].size());
  ASSERT_EQ(progress.size(), 1u);
  std::vector<client::MigrationEnd> ended = master_->ended();
  ASSERT_EQ(ended.size(), 3u);
  for (const client::MigrationEnd& end : ended) EXPECT_EQ(end.copied, end.key != "k1") << end.key;
  // The copies landed on seg-b, byte for byte.
  for (size_t i : {0u, 2u}) {
    Placement p = master_->Replica(absl::StrCat("k", i));
    EXPECT_EQ(p.segment_name, "seg-b");
    EXPECT_EQ(segments_->Bytes(p.endpoint, p.offset, p.length), values[i]);
  }
}

// The directory: loaded once at Create, then only in the background.
TEST(SegmentDirectoryTest, LookupsNeverWaitForTheMaster) {
  std::vector<client::SegmentEntry> segments = TwoRemoteSegments();
  segments.push_back({.name = "local", .endpoint = "127.0.0.1:7001", .host = "here",
                      .shm_socket = "/tmp/local.sock", .machine_id = "this-machine"});
  FakeMaster master(segments);
  client::SegmentDirectory directory(master, "this-machine", absl::Seconds(60));
  ASSERT_TRUE(directory.Refresh().ok());
  EXPECT_EQ(directory.ShmSocket("127.0.0.1:7001"), "/tmp/local.sock");
  EXPECT_EQ(directory.ShmSocket("10.0.0.1:7001"), std::nullopt);
  EXPECT_EQ(directory.LocalShmEndpoints(), std::vector<std::string>{"127.0.0.1:7001"});
  directory.Start();
  // The master is now slow; a lookup of an unknown endpoint answers at once (remote), and
  // the refresh it asks for happens on the directory's thread.
  master.list_delay_ms = 1500;
  absl::Time before = absl::Now();
  EXPECT_EQ(directory.ShmSocket("10.9.9.9:7001"), std::nullopt);
  EXPECT_LT(absl::Now() - before, absl::Milliseconds(100));
  // The background refresh may already be inside ListSegments, but it cannot have finished.
  EXPECT_EQ(directory.refreshes(), 1u);
  absl::Time give_up = absl::Now() + absl::Seconds(10);
  while (directory.refreshes() < 2 && absl::Now() < give_up) absl::SleepFor(absl::Milliseconds(20));
  EXPECT_EQ(directory.refreshes(), 2u);
  EXPECT_EQ(master.lists.load(), 2);
  // Known endpoints do not ask.
  EXPECT_EQ(directory.ShmSocket("127.0.0.1:7001"), "/tmp/local.sock");
  absl::SleepFor(absl::Milliseconds(1200));
  EXPECT_EQ(master.lists.load(), 2);
}

TEST(SegmentDirectoryTest, AFailedRefreshKeepsTheOldList) {
  std::vector<client::SegmentEntry> segments = {
      {.name = "local", .endpoint = "127.0.0.1:7001", .host = "here",
       .shm_socket = "/tmp/local.sock", .machine_id = "this-machine"}};
  FakeMaster master(segments);
  client::SegmentDirectory directory(master, "this-machine", absl::Seconds(60));
  ASSERT_TRUE(directory.Refresh().ok());
  master.unavailable = true;
  EXPECT_FALSE(directory.Refresh().ok());
  EXPECT_EQ(directory.ShmSocket("127.0.0.1:7001"), "/tmp/local.sock");
  EXPECT_EQ(directory.refreshes(), 1u);
}

}  // namespace
}  // namespace kvpool
