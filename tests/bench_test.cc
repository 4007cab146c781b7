// kvpool-bench end to end: starts its own pool (embedded, then two segments), runs every
// workload for a moment with tiny sizes beside its baselines, and checks that the JSON report
// has every field and sane numbers. Keeps the tool working; it measures nothing itself.

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace {

using nlohmann::json;

struct BenchRun {
  int exit_code = -1;
  std::string out;
};

BenchRun RunBench(const std::vector<std::string>& args) {
  std::string command = KVPOOL_BENCH_BIN;
  for (const std::string& arg : args) command += " '" + arg + "'";
  BenchRun run;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return run;
  char chunk[4096];
  size_t n;
  while ((n = fread(chunk, 1, sizeof(chunk), pipe)) > 0) run.out.append(chunk, n);
  int status = pclose(pipe);
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return run;
}

bool HaveRedis() {
  for (const char* path : {"/usr/bin/redis-server", "/usr/local/bin/redis-server"}) {
    if (access(path, X_OK) == 0) return true;
  }
  return false;
}

// The common flags: a small pool, small values, a fraction of a second per run.
std::vector<std::string> QuickFlags() {
  return {"--start-pool",
          "--pool-size=64MiB",
          "--duration=200ms",
          "--warmup=50ms",
          "--memcpy-working-set=64MiB",
          "--client-buffer=1MiB",
          "--json",
          "--progress=off"};
}

const json* FindResult(const json& report, const std::string& workload, const std::string& system) {
  for (const json& result : report["results"]) {
    if (result["workload"] == workload && result["system"] == system) return &result;
  }
  return nullptr;
}

void ExpectSane(const json& result, bool moves_bytes) {
  SCOPED_TRACE(result.dump());
  ASSERT_FALSE(result.contains("failure"));
  EXPECT_EQ(result["errors"].get<uint64_t>(), 0u);
  EXPECT_GT(result["calls"].get<uint64_t>(), 0u);
  EXPECT_GT(result["ops"].get<uint64_t>(), 0u);
  EXPECT_GT(result["ops_per_s"].get<double>(), 0);
  EXPECT_GT(result["seconds"].get<double>(), 0);
  if (moves_bytes) {
    EXPECT_GT(result["gb_per_s"].get<double>(), 0);
    EXPECT_EQ(result["bytes"].get<uint64_t>(),
              result["ops"].get<uint64_t>() * result["value_size"].get<uint64_t>());
  }
  const json& latency = result["latency_us"];
  EXPECT_GT(latency["p50"].get<double>(), 0);
  EXPECT_GE(latency["p99"].get<double>(), latency["p50"].get<double>());
  EXPECT_GE(latency["p999"].get<double>(), latency["p99"].get<double>());
  EXPECT_GE(latency["max"].get<double>(), latency["p999"].get<double>());
}

TEST(BenchTest, EveryWorkloadBesideItsBaselines) {
  std::string baselines = HaveRedis() ? "tcp,memcpy,redis" : "tcp,memcpy";
  if (!HaveRedis()) std::fprintf(stderr, "redis-server not installed: Redis baseline not tested\n");
  std::vector<std::string> args = QuickFlags();
  args.insert(args.end(), {"--workloads=get,put,mixed,meta,meta-local", "--value-size=64KiB",
                           "--batch-size=4", "--keys=64", "--baselines=" + baselines});
  BenchRun run = RunBench(args);
  ASSERT_EQ(run.exit_code, 0) << run.out;
  json report = json::parse(run.out);

  EXPECT_EQ(report["tool"], "kvpool-bench");
  EXPECT_EQ(report["config"]["value_size"], "65536");
  std::set<std::string> systems = {"kvpool", "tcp", "memcpy"};
  if (HaveRedis()) systems.insert("redis");
  for (const std::string workload : {"get", "put", "mixed"}) {
    for (const std::string& system : systems) {
      SCOPED_TRACE(workload + " " + system);
      const json* result = FindResult(report, workload, system);
      ASSERT_NE(result, nullptr);
      ExpectSane(*result, true);
    }
  }
  for (const std::string workload : {"meta-put", "meta-exist", "meta-local"}) {
    SCOPED_TRACE(workload);
    const json* result = FindResult(report, workload, "kvpool");
    ASSERT_NE(result, nullptr);
    ExpectSane(*result, false);
  }
  if (HaveRedis()) ExpectSane(*FindResult(report, "meta-exist", "redis"), false);

  // kvpool's ratio to every baseline of every data workload.
  for (const std::string workload : {"get", "put", "mixed"}) {
    for (const std::string& system : systems) {
      if (system == "kvpool") continue;
      bool found = false;
      for (const json& ratio : report["ratios"]) {
        if (ratio["workload"] == workload && ratio["baseline"] == system) {
          found = true;
          EXPECT_GT(ratio["throughput"].get<double>(), 0) << ratio.dump();
          EXPECT_GT(ratio["p50_latency"].get<double>(), 0) << ratio.dump();
        }
      }
      EXPECT_TRUE(found) << workload << " vs " << system;
    }
  }

  // Memory: the client's, and the master's (which holds the 64 MiB pool, touched up front).
  const json& memory = report["memory"];
  EXPECT_GT(memory["client"]["start"]["rss_bytes"].get<uint64_t>(), 0u);
  EXPECT_GT(memory["client"]["end"]["private_bytes"].get<uint64_t>(), 0u);
  EXPECT_GT(memory["client"]["peak_bytes"].get<uint64_t>(), 0u);
  const json* get = FindResult(report, "get", "kvpool");
  EXPECT_GT((*get)["client_memory"]["after"]["rss_bytes"].get<uint64_t>(), 0u);
  ASSERT_GE(memory["servers"].size(), 1u);
  EXPECT_EQ(memory["servers"][0]["name"], "kvpool-master");
  EXPECT_GE(memory["servers"][0]["end"]["peak_bytes"].get<uint64_t>(), 64u << 20);
  EXPECT_GT(memory["servers"][0]["start"]["rss_bytes"].get<uint64_t>(), 0u);
}

TEST(BenchTest, SingleGetLatencyOverSegmentsAgainstTheRoundTrip) {
  std::vector<std::string> args = QuickFlags();
  args.insert(args.end(), {"--segments=2", "--transport=tcp", "--workloads=get",
                           "--value-size=4KiB", "--batch-size=1", "--keys=16", "--baselines=tcp"});
  BenchRun run = RunBench(args);
  ASSERT_EQ(run.exit_code, 0) << run.out;
  json report = json::parse(run.out);
  EXPECT_EQ(report["config"]["segments"], "2");
  ASSERT_NE(FindResult(report, "get", "kvpool"), nullptr);
  ASSERT_NE(FindResult(report, "get", "tcp-rtt"), nullptr);
  ExpectSane(*FindResult(report, "get", "kvpool"), true);
  EXPECT_EQ((*FindResult(report, "get", "kvpool"))["detail"].get<std::string>().rfind(
                "tcp transport,", 0),
            0u);
  ExpectSane(*FindResult(report, "get", "tcp"), true);
  ExpectSane(*FindResult(report, "get", "tcp-rtt"), false);
  bool found = false;
  for (const json& ratio : report["ratios"]) {
    if (ratio["baseline"] == "tcp-rtt") {
      found = true;
      EXPECT_GT(ratio["p50_latency"].get<double>(), 0);
    }
  }
  EXPECT_TRUE(found);
  // Master and two segments.
  EXPECT_EQ(report["memory"]["servers"].size(), 3u);
}

TEST(BenchTest, BadFlagsAreAUsageError) {
  EXPECT_EQ(RunBench({"--workloads=nope"}).exit_code, 2);
  EXPECT_EQ(RunBench({"--transport=carrier-pigeon"}).exit_code, 2);
  EXPECT_EQ(RunBench({"--baselines=postgres"}).exit_code, 2);
}

}  // namespace
