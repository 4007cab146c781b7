#include "tests/harness/ha_fixture.h"

#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "grpcpp/grpcpp.h"
#include "kvpool/v1/master.grpc.pb.h"
#include "proto/channel.h"
#include "tests/harness/eventually.h"
#include "tests/harness/values.h"

namespace kvpool::testing {
namespace {

std::string ValueOf(const std::string& key) {
  return RandomValue(2048 + std::hash<std::string>()(key) % 4096,
                     static_cast<uint32_t>(std::hash<std::string>()(key)));
}

// Keys the cached reader reads over and over (written before the load starts).
constexpr int kWarmKeys = 16;
constexpr absl::Duration kSlowRead = absl::Milliseconds(200);

}  // namespace

absl::Duration HaFixture::LeaseOr(absl::Duration fallback) {
  absl::Duration lease = fallback;
  if (const char* env = std::getenv("KVPOOL_HA_LEASE")) {
    if (!absl::ParseDuration(env, &lease)) lease = fallback;
  }
  return lease;
}

void HaFixture::StartPool(const HaPlacement& placement, absl::Duration lease) {
  placement_ = placement;
  lease_ = lease;
  ASSERT_EQ(placement_.masters.size(), static_cast<size_t>(kMasters));
  absl::StatusOr<std::unique_ptr<EtcdServer>> etcd = EtcdServer::Start(placement_.etcd);
  if (absl::IsNotFound(etcd.status())) GTEST_SKIP() << etcd.status().message();
  ASSERT_TRUE(etcd.ok()) << etcd.status();
  etcd_ = std::move(*etcd);
  for (int i = 0; i < kMasters; ++i) {
    uint16_t port = placement_.master_port;
    if (port == 0) {
      absl::StatusOr<uint16_t> free = PickFreePort(placement_.masters[i].address);
      ASSERT_TRUE(free.ok()) << free.status();
      port = *free;
    }
    addresses_.push_back(absl::StrCat(placement_.masters[i].address, ":", port));
    if (placement_.etcd_proxies) {
      absl::StatusOr<std::unique_ptr<TcpProxy>> proxy = TcpProxy::Start(etcd_->endpoint());
      ASSERT_TRUE(proxy.ok()) << proxy.status();
      etcd_proxies_.push_back(std::move(*proxy));
    }
  }
  masters_.resize(kMasters);
  for (int i = 0; i < kMasters; ++i) ASSERT_NO_FATAL_FAILURE(StartMasterAt(i));
  master_list_ = absl::StrJoin(addresses_, ",");
  ASSERT_GE(WaitForLeader(absl::Seconds(30)), 0);
  ASSERT_TRUE(WaitForAllToNameLeader(absl::Seconds(10))) << "the standbys never named the leader";
  for (const Host& host : placement_.segments) {
    absl::StatusOr<SegmentProcess> segment =
        StartSegment(master_list_, "64MiB", placement_.segment_flags, host);
    ASSERT_TRUE(segment.ok()) << segment.status();
    segments_.push_back(std::move(*segment));
  }
  client_options_.master_address = master_list_;
  client_options_.rpc_timeout = absl::Seconds(5);
  client_options_.transfer_timeout = absl::Seconds(5);
  ClientOptions uncached = client_options_;
  uncached.cache_locations = false;
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Create(uncached);
  ASSERT_TRUE(client.ok()) << client.status();
  client_ = std::move(*client);
  ClientOptions cached = client_options_;
  cached.cache_locations = true;
  client = Client::Create(cached);
  ASSERT_TRUE(client.ok()) << client.status();
  cached_client_ = std::move(*client);
}

void HaFixture::TearDown() { StopLoad(); }

void HaFixture::StartMasterAt(int i) {
  std::string etcd = placement_.etcd_proxies ? etcd_proxies_[i]->address() : etcd_->endpoint();
  std::vector<std::string> flags = {"--embedded-segment-size=0", "--etcd=" + etcd,
                                    absl::StrCat("--leader-lease=", absl::FormatDuration(lease_))};
  flags.insert(flags.end(), placement_.master_flags.begin(), placement_.master_flags.end());
  absl::StatusOr<MasterProcess> master = StartMaster(flags, addresses_[i], placement_.masters[i]);
  ASSERT_TRUE(master.ok()) << master.status();
  masters_[i] = std::move(*master);
}

Role HaFixture::RoleOf(int i, absl::Duration timeout) {
  auto stub = v1::MasterService::NewStub(MakeMasterChannel(addresses_[i]));
  grpc::ClientContext context;
  absl::Time asked = absl::Now();
  context.set_deadline(absl::ToChronoTime(asked + timeout));
  v1::GetClusterStatusResponse response;
  if (!stub->GetClusterStatus(&context, v1::GetClusterStatusRequest(), &response).ok()) {
    return Role{.role = "down", .asked = asked, .answered = absl::Now()};
  }
  return Role{response.role(), response.term(), response.leader(), asked, absl::Now()};
}

bool HaFixture::TwoLeaders(int i, const Role& role) {
  if (role.role != "leader") return false;
  absl::MutexLock lock(&mu_);
  if (role.term > newest_term_) {
    newest_term_ = role.term;
    newest_term_master_ = i;
    newest_term_seen_ = role.answered;
    return false;
  }
  if (role.term == newest_term_) return i != newest_term_master_;
  return role.asked > newest_term_seen_;
}

int HaFixture::WaitForLeader(absl::Duration timeout, int other_than) {
  absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    int leader = -1;
    int64_t term = 0;
    for (int i = 0; i < kMasters; ++i) {
      if (i == other_than) continue;
      Role role = RoleOf(i);
      EXPECT_FALSE(TwoLeaders(i, role))
          << "two leaders at once: " << addresses_[i] << " leads term " << role.term;
      if (role.role == "leader" && role.term > term) {
        leader = i;
        term = role.term;
      }
    }
    if (leader >= 0) return leader;
    absl::SleepFor(absl::Milliseconds(50));
  }
  return -1;
}

bool HaFixture::WaitForAllToNameLeader(absl::Duration timeout) {
  return Eventually(
      [&] {
        std::vector<Role> roles;
        for (int i = 0; i < kMasters; ++i) roles.push_back(RoleOf(i));
        return std::all_of(roles.begin(), roles.end(), [&](const Role& role) {
          return !role.leader.empty() && role.leader == roles[0].leader &&
                 role.term == roles[0].term;
        });
      },
      timeout);
}

void HaFixture::CutFromEtcd(int i) {
  ASSERT_TRUE(placement_.etcd_proxies) << "no way to cut a master from etcd";
  etcd_proxies_[i]->Cut();
}

// --- The load ---

void HaFixture::StartLoad() {
  // The cached reader's keys, and their locations in its cache.
  std::vector<std::string> warm;
  for (int k = 0; k < kWarmKeys; ++k) {
    std::string key = absl::StrCat(key_prefix_, "-warm-", k);
    ASSERT_TRUE(client_->Put(key, ValueOf(key)).ok()) << key;
    absl::StatusOr<std::string> got = cached_client_->Get(key);
    ASSERT_TRUE(got.ok()) << got.status();
    warm.push_back(key);
    absl::MutexLock lock(&mu_);
    acked_.push_back(key);
    ack_times_.push_back(absl::Now());
    ack_starts_.push_back(absl::Now());
  }
  // Longer than this, a call outlived every deadline the client set on it: the two master
  // calls of a put or get and the transfer, and a second of slack.
  absl::Duration bound = 2 * client_options_.rpc_timeout + client_options_.transfer_timeout +
                         absl::Seconds(1);
  auto timed = [this, bound](absl::Time started) {
    if (absl::Now() - started > bound) {
      absl::MutexLock lock(&mu_);
      ++past_deadline_;
    }
  };
  {
    absl::MutexLock lock(&mu_);
    leader_seen_ = absl::Now();
  }
  for (int w = 0; w < 2; ++w) {
    threads_.emplace_back([this, w, timed] {
      for (int n = 0; !stop_.load(); ++n) {
        std::string key = absl::StrCat(key_prefix_, "-", w, "-", n);
        absl::Time started = absl::Now();
        absl::Status put = client_->Put(key, ValueOf(key));
        timed(started);
        absl::MutexLock lock(&mu_);
        if (put.ok()) {
          acked_.push_back(key);
          ack_times_.push_back(absl::Now());
          ack_starts_.push_back(started);
        } else {
          ++put_failures_;
        }
      }
    });
  }
  threads_.emplace_back([this, timed] {
    std::mt19937 rng(7);
    while (!stop_.load()) {
      std::string key;
      {
        absl::MutexLock lock(&mu_);
        key = acked_[rng() % acked_.size()];
      }
      absl::Time started = absl::Now();
      absl::StatusOr<std::string> got = client_->Get(key);
      timed(started);
      absl::MutexLock lock(&mu_);
      ++reads_;
      if (got.ok() && *got != ValueOf(key)) ++wrong_bytes_;
      if (!got.ok() && absl::IsDataLoss(got.status())) ++wrong_bytes_;
      if (!got.ok()) ++read_failures_;
    }
  });
  threads_.emplace_back([this, warm, timed] {
    for (size_t n = 0; !stop_.load(); ++n) {
      const std::string& key = warm[n % warm.size()];
      absl::Time started = absl::Now();
      absl::StatusOr<std::string> got = cached_client_->Get(key);
      timed(started);
      absl::Duration took = absl::Now() - started;
      absl::MutexLock lock(&mu_);
      ++cached_reads_;
      if (got.ok() && *got != ValueOf(key)) ++wrong_bytes_;
      if (!got.ok() && absl::IsDataLoss(got.status())) ++wrong_bytes_;
      if (!got.ok()) {
        ++cached_failed_;
        ++cached_failures_[std::string(got.status().message().substr(0, 60))];
      }
      if (took > kSlowRead) ++cached_slow_;
      longest_cached_read_ = std::max(longest_cached_read_, took);
    }
  });
  threads_.emplace_back([this] { Watch(); });
}

void HaFixture::Watch() {
  while (!stop_.load()) {
    int leaders = 0;
    bool two = false;
    for (int i = 0; i < kMasters; ++i) {
      Role role = RoleOf(i);
      if (role.role == "leader") ++leaders;
      two = TwoLeaders(i, role) || two;
    }
    absl::Time now = absl::Now();
    absl::MutexLock lock(&mu_);
    if (two) ++two_leaders_;
    if (leaders > 0) {
      leaderless_ = std::max(leaderless_, now - leader_seen_);
      leader_seen_ = now;
    }
    mu_.AwaitWithTimeout(absl::Condition(+[](std::atomic<bool>* stop) { return stop->load(); },
                                         &stop_),
                         absl::Milliseconds(50));
  }
}

void HaFixture::StopLoad() {
  {
    absl::MutexLock lock(&mu_);
    stop_.store(true);
  }
  for (std::thread& thread : threads_) thread.join();
  threads_.clear();
}

size_t HaFixture::Acked() {
  absl::MutexLock lock(&mu_);
  return acked_.size();
}

bool HaFixture::WaitForAcks(size_t more, absl::Duration timeout) {
  size_t target = Acked() + more;
  absl::Time deadline = absl::Now() + timeout;
  while (Acked() < target) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return true;
}

absl::Duration HaFixture::LongestWriteGap(absl::Time since) {
  absl::MutexLock lock(&mu_);
  std::vector<absl::Time> times = ack_times_;
  std::sort(times.begin(), times.end());
  absl::Duration gap;
  absl::Time previous = since;
  for (absl::Time t : times) {
    if (t < since) continue;
    gap = std::max(gap, t - previous);
    previous = t;
  }
  return gap;
}

absl::Duration HaFixture::WritesResumed(absl::Time since, absl::Duration timeout) {
  absl::Time deadline = absl::Now() + timeout;
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      bool found = false;
      absl::Time resumed;
      for (size_t i = 0; i < ack_starts_.size(); ++i) {
        if (ack_starts_[i] > since && (!found || ack_times_[i] < resumed)) {
          resumed = ack_times_[i];
          found = true;
        }
      }
      if (found) return resumed - since;
    }
    if (absl::Now() > deadline) return absl::InfiniteDuration();
    absl::SleepFor(absl::Milliseconds(10));
  }
}

size_t HaFixture::VerifyAll(size_t* wrong) {
  std::vector<std::string> acked;
  {
    absl::MutexLock lock(&mu_);
    acked = acked_;
  }
  size_t lost = 0;
  absl::Time deadline = absl::Now() + absl::Seconds(20);
  for (const std::string& key : acked) {
    absl::StatusOr<std::string> got = client_->Get(key);
    while (!got.ok() && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(100));
      got = client_->Get(key);
    }
    if (!got.ok()) {
      ++lost;
      ADD_FAILURE() << "acknowledged put lost: " << key << ": " << got.status();
    } else if (*got != ValueOf(key)) {
      ++*wrong;
    }
  }
  return lost;
}

void HaFixture::Report(const std::string& fault, absl::Time since) {
  absl::Duration gap = LongestWriteGap(since);
  absl::MutexLock lock(&mu_);
  std::printf(
      "ha %s: acked_puts=%zu failed_puts=%zu reads=%zu failed_reads=%zu wrong_bytes=%zu "
      "cached_reads=%zu cached_failed=%zu cached_slow=%zu longest_cached_read=%s "
      "past_deadline=%zu longest_write_gap=%s leaderless=%s two_leaders=%zu\n",
      fault.c_str(), acked_.size(), put_failures_, reads_, read_failures_, wrong_bytes_,
      cached_reads_, cached_failed_, cached_slow_,
      absl::FormatDuration(longest_cached_read_).c_str(), past_deadline_,
      absl::FormatDuration(gap).c_str(), absl::FormatDuration(leaderless_).c_str(),
      two_leaders_);
  for (const auto& [why, count] : cached_failures_) {
    std::printf("  cached reads failed %zu times: %s...\n", count, why.c_str());
  }
  std::fflush(stdout);
  EXPECT_EQ(wrong_bytes_, 0u);
  EXPECT_EQ(past_deadline_, 0u);
  EXPECT_EQ(two_leaders_, 0u);
}

void HaFixture::FinishAndVerify(const std::string& fault, absl::Time since, size_t more) {
  ASSERT_TRUE(WaitForAcks(more, absl::Seconds(30))) << fault << ": writes did not go on";
  StopLoad();
  Report(fault, since - absl::Seconds(1));
  size_t wrong = 0;
  EXPECT_EQ(VerifyAll(&wrong), 0u);
  EXPECT_EQ(wrong, 0u);
}

// --- The scenarios ---

void HaFixture::KillNineOfTheLeader(absl::Duration resume_bound) {
  int leader = WaitForLeader(absl::Seconds(10));
  ASSERT_GE(leader, 0);
  int64_t old_term = RoleOf(leader).term;
  ASSERT_NO_FATAL_FAILURE(StartLoad());
  ASSERT_TRUE(WaitForAcks(50, absl::Seconds(30)));
  absl::Time killed = absl::Now();
  masters_[leader].process->Signal(SIGKILL);
  masters_[leader].process->Wait();
  int next = WaitForLeader(absl::Seconds(30), leader);
  ASSERT_GE(next, 0);
  EXPECT_GT(RoleOf(next).term, old_term);
  // Writes resume on the new leader without anyone telling the client.
  absl::Duration resumed = WritesResumed(killed, absl::Seconds(30));
  std::printf("ha kill -9: writes resumed %s after the kill (lease %s)\n",
              absl::FormatDuration(resumed).c_str(), absl::FormatDuration(lease_).c_str());
  EXPECT_LT(resumed, resume_bound);
  FinishAndVerify("kill -9", killed, 50);
}

void HaFixture::StopTheLeaderPastItsLease(absl::Duration resume_bound) {
  int leader = WaitForLeader(absl::Seconds(10));
  ASSERT_GE(leader, 0);
  // A client of the old leader alone, with a deadline longer than the stop: its put waits
  // in the stopped process's socket and is the first thing it sees on waking.
  ClientOptions direct = client_options_;
  direct.master_address = addresses_[leader];
  direct.rpc_timeout = absl::Seconds(30);
  absl::StatusOr<std::unique_ptr<Client>> old_leader = Client::Create(direct);
  ASSERT_TRUE(old_leader.ok()) << old_leader.status();
  ASSERT_NO_FATAL_FAILURE(StartLoad());
  ASSERT_TRUE(WaitForAcks(30, absl::Seconds(30)));
  absl::Time stopped = absl::Now();
  masters_[leader].process->Signal(SIGSTOP);
  std::string late_key = key_prefix_ + "-late-put-to-the-old-leader";
  absl::Status late_put = absl::UnknownError("not done");
  std::thread late([&] { late_put = (*old_leader)->Put(late_key, "x"); });
  int next = WaitForLeader(absl::Seconds(30), leader);
  EXPECT_GE(next, 0);
  absl::Duration resumed = WritesResumed(stopped, absl::Seconds(30));
  std::printf("ha SIGSTOP: writes resumed %s after the stop (lease %s)\n",
              absl::FormatDuration(resumed).c_str(), absl::FormatDuration(lease_).c_str());
  EXPECT_LT(resumed, resume_bound);
  ASSERT_TRUE(WaitForAcks(30, absl::Seconds(30)));
  // Its lease ran out long ago; it wakes.
  absl::SleepFor(absl::Seconds(1));
  masters_[leader].process->Signal(SIGCONT);
  late.join();
  if (next < 0) return;
  // The deposed leader answered nothing but a refusal (or was already restarting).
  EXPECT_FALSE(late_put.ok());
  EXPECT_FALSE(client_->Get(late_key).ok());
  // It comes back as a standby of the new leader (before it restarts, the deposed process
  // itself already answers as one).
  absl::Time deadline = absl::Now() + absl::Seconds(30);
  Role back = RoleOf(leader);
  while (!(back.role == "standby" && back.leader == addresses_[next]) &&
         absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(100));
    back = RoleOf(leader);
  }
  EXPECT_EQ(back.role, "standby");
  EXPECT_EQ(back.leader, addresses_[next]);
  EXPECT_EQ(WaitForLeader(absl::Seconds(5)), next);
  FinishAndVerify("SIGSTOP past the lease", stopped);
}

void HaFixture::CutTheLeaderFromEtcd(absl::Duration resume_bound) {
  int leader = WaitForLeader(absl::Seconds(10));
  ASSERT_GE(leader, 0);
  ClientOptions direct = client_options_;
  direct.master_address = addresses_[leader];
  direct.rpc_timeout = absl::Seconds(2);
  absl::StatusOr<std::unique_ptr<Client>> old_leader = Client::Create(direct);
  ASSERT_TRUE(old_leader.ok()) << old_leader.status();
  ASSERT_NO_FATAL_FAILURE(StartLoad());
  ASSERT_TRUE(WaitForAcks(30, absl::Seconds(30)));
  absl::Time cut = absl::Now();
  ASSERT_NO_FATAL_FAILURE(CutFromEtcd(leader));
  // Clients and segments still reach it; it must stop leading on its own, before its lease
  // can run out at etcd (and so before anyone else can be elected).
  absl::Time deadline = absl::Now() + absl::Seconds(30);
  // (A slow answer is waited for: only a refusal, another role or a restart says it stopped.)
  // An answer is no older than its call, and can be hundreds of milliseconds younger on a
  // loaded machine: a "leader" answer proves it led when that call was sent, no later.
  absl::Time last_led = cut;      // when the last call it answered as the leader was sent
  absl::Time stepped_down = cut;  // when its first other answer came back
  while (absl::Now() < deadline) {
    Role role = RoleOf(leader, absl::Seconds(2));
    stepped_down = role.answered;
    if (role.role != "leader") break;
    last_led = role.asked;
    absl::SleepFor(absl::Milliseconds(20));
  }
  absl::Duration led_on = last_led - cut;
  EXPECT_LT(led_on, lease_) << "it led on a call sent " << led_on << " after the cut";
  // Past its lease, still reachable by clients: it takes no write.
  absl::SleepFor(cut + lease_ - absl::Now());
  absl::Status after_lease = (*old_leader)->Put(key_prefix_ + "-put-to-the-cut-leader", "x");
  EXPECT_FALSE(after_lease.ok()) << "the cut leader took a put after its lease ended";
  // A new leader; never two at once (WaitForLeader checks every master each round).
  int next = -1;
  while (absl::Now() < deadline) {
    int seen = WaitForLeader(absl::Seconds(1));
    if (seen >= 0 && seen != leader) {
      next = seen;
      break;
    }
  }
  ASSERT_GE(next, 0);
  // The cut leader served until it stepped down: writes resumed with the first ack of a put
  // begun after that, counted from the cut.
  absl::Duration resumed = (stepped_down - cut) + WritesResumed(stepped_down, absl::Seconds(30));
  std::printf("ha cut from etcd: the leader stepped down %s-%s after the cut, writes resumed %s "
              "after the cut (lease %s)\n",
              absl::FormatDuration(led_on).c_str(),
              absl::FormatDuration(stepped_down - cut).c_str(),
              absl::FormatDuration(resumed).c_str(),
              absl::FormatDuration(lease_).c_str());
  EXPECT_LT(resumed, resume_bound);
  FinishAndVerify("leader cut from etcd", cut);
}

void HaFixture::RestartEtcd() {
  int leader = WaitForLeader(absl::Seconds(10));
  ASSERT_GE(leader, 0);
  ASSERT_NO_FATAL_FAILURE(StartLoad());
  ASSERT_TRUE(WaitForAcks(30, absl::Seconds(30)));
  absl::Time killed = absl::Now();
  etcd_->Kill();
  absl::SleepFor(absl::Seconds(1));
  ASSERT_TRUE(etcd_->Restart().ok());
  ASSERT_GE(WaitForLeader(absl::Seconds(30)), 0);
  FinishAndVerify("etcd restarted", killed, 30);
}

void HaFixture::FailoverLoop() {
  const char* rounds_env = std::getenv("KVPOOL_FAILOVER_ROUNDS");
  if (rounds_env == nullptr) GTEST_SKIP() << "set KVPOOL_FAILOVER_ROUNDS=N to run";
  int rounds = std::atoi(rounds_env);
  ASSERT_NO_FATAL_FAILURE(StartLoad());
  ASSERT_TRUE(WaitForAcks(20, absl::Seconds(30)));
  std::vector<absl::Duration> resumes;
  for (int round = 0; round < rounds; ++round) {
    int leader = WaitForLeader(absl::Seconds(30));
    ASSERT_GE(leader, 0);
    // Settled: both segments mounted on the leader.
    absl::SleepFor(absl::Seconds(2));
    ASSERT_TRUE(WaitForAcks(10, absl::Seconds(30)));
    absl::Time killed = absl::Now();
    masters_[leader].process->Signal(SIGKILL);
    masters_[leader].process->Wait();
    // Writes resumed: the first acknowledgement of a put begun after the kill (a put the old
    // leader answered just before it died does not count).
    resumes.push_back(WritesResumed(killed, absl::Seconds(60)));
    ASSERT_LT(resumes.back(), absl::Seconds(60)) << "writes never resumed";
    std::printf("failover %d: writes resumed %s after kill -9 of %s\n", round + 1,
                absl::FormatDuration(resumes.back()).c_str(), addresses_[leader].c_str());
    std::fflush(stdout);
    ASSERT_NO_FATAL_FAILURE(StartMasterAt(leader));
  }
  std::sort(resumes.begin(), resumes.end());
  auto at = [&](double q) {
    return absl::FormatDuration(
        resumes[std::min(resumes.size() - 1, static_cast<size_t>(q * resumes.size()))]);
  };
  std::printf("failover distribution (%zu, lease %s): min %s p50 %s p90 %s max %s\n",
              resumes.size(), absl::FormatDuration(lease_).c_str(), at(0).c_str(),
              at(0.5).c_str(), at(0.9).c_str(), absl::FormatDuration(resumes.back()).c_str());
  FinishAndVerify("failover loop", absl::Now(), 10);
}

}  // namespace kvpool::testing
