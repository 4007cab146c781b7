// kvpool-bench: load generator and benchmark of a kvpool pool, with the ceilings and
// alternatives it is judged against measured side by side in the same run (raw loopback TCP,
// memcpy, Redis), on the same value sizes, batch sizes and concurrency.
//
//   kvpool-bench --start-pool --workloads=get,put --value-size=512KiB --batch-size=32
//   kvpool-bench --master=HOST:50051 --workloads=mixed --read-fraction=0.9 --threads=4
//   kvpool-bench --start-pool --workloads=meta --batch-size=256 --baselines=redis
//
// Prints a table per workload (GB/s, ops/s, p50/p99/p99.9 latency, kvpool's ratio to each
// baseline) and the memory used by the client and by the servers it started; --json prints
// the same as one JSON document. Exit status: 0 done, 1 a run failed or had errors, 2 bad
// flags or no pool, 130 interrupted (SIGINT/SIGTERM: what was measured is still printed).

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "client/tools/credential_flags.h"
#include "absl/flags/flag.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "client/tools/bench/child_process.h"
#include "client/tools/bench/cpu_usage.h"
#include "client/tools/bench/kvpool_target.h"
#include "client/tools/bench/local_pool.h"
#include "client/tools/bench/memcpy_baseline.h"
#include "client/tools/bench/redis_baseline.h"
#include "client/tools/bench/report.h"
#include "client/tools/bench/runner.h"
#include "client/tools/bench/tcp_baseline.h"
#include "common/flags.h"
#include "common/size.h"
#include "kvpool/client.h"

// What to measure.
ABSL_FLAG(std::string, workloads, "get,put",
          "Comma-separated: get, put, mixed, meta (= meta-put and meta-exist), meta-put, "
          "meta-exist, meta-local (BatchGetLocal: needs the pool on this machine)");
ABSL_FLAG(kvpool::ByteSize, value_size, kvpool::ByteSize{512 << 10}, "Bytes per value");
ABSL_FLAG(int, batch_size, 32, "Values (or keys, for meta) per call");
ABSL_FLAG(uint64_t, keys, 0,
          "Working set that gets read, in values (0: about 512 MiB of values, at most half the "
          "pool; 16384 keys for meta-exist)");
ABSL_FLAG(int, threads, 1, "Client threads, each with one call in flight");
ABSL_FLAG(bool, shared_client, true,
          "Threads share one kvpool::Client (false: one Client, and master channel, each)");
ABSL_FLAG(int, connections, 2,
          "kvpool's connections per segment within a batch (ClientOptions::connections_per_"
          "segment); the socket baselines open as many per thread");
ABSL_FLAG(double, read_fraction, 0.5, "mixed: fraction of calls that are gets");
ABSL_FLAG(absl::Duration, duration, absl::Seconds(10), "Measured time per workload and system");
ABSL_FLAG(uint64_t, iterations, 0,
          "Measured calls per thread instead of --duration (0: use --duration)");
ABSL_FLAG(absl::Duration, warmup, absl::Seconds(1), "Untimed calls before each measurement");
ABSL_FLAG(std::string, transport, "auto", "kvpool's data transport: auto, tcp, shm or rdma");
ABSL_FLAG(bool, verify_checksums, true,
          "kvpool gets check every value's checksum (the client's default; false to measure "
          "what it costs)");
ABSL_FLAG(bool, cache_locations, true,
          "kvpool clients reuse the master's answers under their lease "
          "(ClientOptions::cache_locations)");
ABSL_FLAG(bool, read_by_key, true,
          "kvpool gets read a key from its home segment before asking the master "
          "(ClientOptions::read_by_key; false to measure the master's path)");
ABSL_FLAG(kvpool::ByteSize, client_buffer, kvpool::ByteSize{64 << 20},
          "Client memory per thread that values come from and go to (rotated; at least a batch)");

// Baselines.
ABSL_FLAG(std::string, baselines, "tcp,memcpy,redis",
          "Comma-separated baselines measured in the same run: tcp, memcpy, redis (or none)");
ABSL_FLAG(std::string, redis, "", "Use the Redis at this host:port instead of starting one");
ABSL_FLAG(std::string, redis_bin, "", "redis-server to start (default: found in PATH)");
ABSL_FLAG(kvpool::ByteSize, memcpy_working_set, kvpool::ByteSize{1ull << 30},
          "Memory the memcpy baseline copies across (two halves; keep it far above the L3 size)");
ABSL_FLAG(kvpool::ByteSize, tcp_socket_buffer, kvpool::ByteSize{0},
          "SO_SNDBUF/SO_RCVBUF of the raw TCP baseline (0: the kernel's autotuning)");

// The pool.
ABSL_FLAG(std::string, master, "127.0.0.1:50051",
          "gRPC address of kvpool-master: host:port, a comma-separated list of masters, or "
          "etcd://host:port[,host:port] (the leader is found and followed)");
ABSL_FLAG(bool, start_pool, false,
          "Start a pool for the run on free loopback ports (kvpool-master with an embedded "
          "segment, or with --segments) and stop it at the end");
ABSL_FLAG(kvpool::ByteSize, pool_size, kvpool::ByteSize{4ull << 30},
          "--start-pool: pool bytes in all (touched up front)");
ABSL_FLAG(int, segments, 0,
          "--start-pool: kvpool-segment processes (0: the master's embedded one)");
ABSL_FLAG(int, server_threads, 2, "--start-pool: data-plane threads per segment");
ABSL_FLAG(std::string, master_bin, "",
          "--start-pool: kvpool-master (default: next to this binary)");
ABSL_FLAG(std::string, segment_bin, "",
          "--start-pool: kvpool-segment (default: next to this binary)");
ABSL_FLAG(std::string, master_args, "", "--start-pool: extra kvpool-master flags, space-separated");
ABSL_FLAG(std::string, segment_args, "",
          "--start-pool: extra kvpool-segment flags, space-separated");
ABSL_FLAG(bool, keep_logs, false, "Keep the started servers' logs even when all went well");

// Output.
ABSL_FLAG(bool, json, false, "Print one JSON document instead of the table");
ABSL_FLAG(std::string, json_out, "", "Also write the JSON document to this file");
ABSL_FLAG(std::string, progress, "auto",
          "Progress line on stderr: auto (when it is a terminal), on, off");
ABSL_FLAG(double, quiet_below, 0,
          "Before each run, wait until other processes use less than this fraction of the "
          "machine's CPU over a second (e.g. 0.05; 0: do not wait)");
ABSL_FLAG(absl::Duration, quiet_timeout, absl::Minutes(5),
          "--quiet-below: run anyway after waiting this long (and say so)");
ABSL_FLAG(int, quiet_attempts, 3,
          "--quiet-below: measure a run again (up to this many times in all) when other "
          "processes took more than that fraction of the CPUs during it; the quietest is kept");

namespace kvpool::bench {
namespace {

int UsageError(const std::string& problem) {
  std::fprintf(stderr, "kvpool-bench: %s (--help lists the flags)\n", problem.c_str());
  return 2;
}

int SetupError(const absl::Status& status) {
  std::fprintf(stderr, "kvpool-bench: %s\n", std::string(status.message()).c_str());
  return 2;
}

std::string RandomRunId() {
  std::random_device device;
  return absl::StrFormat("%08x", device());
}

std::string LoadAverage() {
  std::ifstream file("/proc/loadavg");
  std::string one, five, fifteen;
  file >> one >> five >> fifteen;
  return absl::StrCat(one, " ", five, " ", fifteen);
}

std::vector<std::string> Words(const std::string& text) {
  return absl::StrSplit(text, ' ', absl::SkipEmpty());
}

absl::StatusOr<std::vector<WorkloadKind>> ParseWorkloads(const std::string& text) {
  std::vector<WorkloadKind> kinds;
  for (absl::string_view word : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    if (word == "get") {
      kinds.push_back(WorkloadKind::kGet);
    } else if (word == "put") {
      kinds.push_back(WorkloadKind::kPut);
    } else if (word == "mixed") {
      kinds.push_back(WorkloadKind::kMixed);
    } else if (word == "meta") {
      kinds.push_back(WorkloadKind::kMetaPut);
      kinds.push_back(WorkloadKind::kMetaExist);
    } else if (word == "meta-put") {
      kinds.push_back(WorkloadKind::kMetaPut);
    } else if (word == "meta-exist") {
      kinds.push_back(WorkloadKind::kMetaExist);
    } else if (word == "meta-local") {
      kinds.push_back(WorkloadKind::kMetaLocal);
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown workload '", word, "'"));
    }
  }
  if (kinds.empty()) return absl::InvalidArgumentError("--workloads is empty");
  return kinds;
}

absl::StatusOr<TransportKind> ParseTransport(const std::string& text) {
  if (text == "auto") return TransportKind::kAuto;
  if (text == "tcp") return TransportKind::kTcp;
  if (text == "shm") return TransportKind::kSharedMemory;
  if (text == "rdma") return TransportKind::kRdma;
  return absl::InvalidArgumentError(
      absl::StrCat("--transport is auto, tcp, shm or rdma, not '", text, "'"));
}

// Waits until processes other than the bench and its servers use less than `fraction` of the
// CPUs over a second, or `timeout` passes; false then.
bool WaitForQuiet(double fraction, absl::Duration timeout, const std::vector<pid_t>& servers,
                  bool show) {
  absl::Time deadline = absl::Now() + timeout;
  bool waited = false;
  while (!Interrupted()) {
    CpuSample before = SampleCpu(servers);
    std::this_thread::sleep_for(std::chrono::seconds(1));
    CpuShare share = Between(before, SampleCpu(servers));
    double others = share.others + share.steal;
    if (others < fraction) {
      if (waited && show) std::fprintf(stderr, "\r\033[K");
      return true;
    }
    if (absl::Now() > deadline) return false;
    if (show) {
      std::fprintf(stderr, "\r\033[K  waiting for a quiet machine: others use %.0f%% of the CPUs",
                   others * 100);
    }
    waited = true;
  }
  return false;
}

// Prepares, runs and finishes one workload on one system. Resets this process's peak RSS
// before measuring (so the result's peak is the run's own) after adding the old peak to
// `process_peak`.
Result RunOne(System& system, const Workload& workload, const RunOptions& base,
              const std::vector<pid_t>& servers, double quiet_below, uint64_t& process_peak) {
  Result result{.workload = workload, .system = system.name()};
  RunOptions options = base;
  options.label = absl::StrCat(WorkloadName(workload.kind), " ", system.name());
  if (absl::Status prepared = system.Prepare(workload); !prepared.ok()) {
    result.detail = system.Describe(workload);
    result.failure = std::string(prepared.message());
    system.Finish(workload);
    return result;
  }
  absl::StatusOr<std::vector<std::unique_ptr<Worker>>> workers = system.MakeWorkers(workload);
  if (!workers.ok()) {
    result.failure = std::string(workers.status().message());
    system.Finish(workload);
    return result;
  }
  if (quiet_below > 0 && !WaitForQuiet(quiet_below, absl::GetFlag(FLAGS_quiet_timeout), servers,
                                       options.progress != ProgressMode::kOff)) {
    result.noisy = true;
  }
  process_peak = std::max(process_peak, ReadMemoryUse(0).peak_bytes);
  ResetPeakMemory();
  result.memory_before = ReadMemoryUse(0);
  CpuSample cpu_before = SampleCpu(servers);
  result.stats = RunWorkers(*workers, options);
  result.cpu = Between(cpu_before, SampleCpu(servers));
  result.memory_after = ReadMemoryUse(0);
  result.peak_bytes = result.memory_after.peak_bytes;
  process_peak = std::max(process_peak, result.peak_bytes);
  result.detail = system.Describe(workload);
  workers->clear();
  system.Finish(workload);
  return result;
}

int Main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Benchmarks a kvpool pool beside raw TCP, memcpy and Redis.\n"
      "  kvpool-bench --start-pool --workloads=get,put --value-size=512KiB --batch-size=32");
  std::vector<char*> positional = ParseFlags(argc, argv);
  if (positional.size() > 1) return UsageError(absl::StrCat("unexpected argument ", positional[1]));

  absl::StatusOr<std::vector<WorkloadKind>> kinds = ParseWorkloads(absl::GetFlag(FLAGS_workloads));
  if (!kinds.ok()) return UsageError(std::string(kinds.status().message()));
  absl::StatusOr<TransportKind> transport = ParseTransport(absl::GetFlag(FLAGS_transport));
  if (!transport.ok()) return UsageError(std::string(transport.status().message()));
  const uint64_t value_size = absl::GetFlag(FLAGS_value_size).bytes;
  const int batch_size = absl::GetFlag(FLAGS_batch_size);
  const int threads = absl::GetFlag(FLAGS_threads);
  const int connections = absl::GetFlag(FLAGS_connections);
  const double read_fraction = absl::GetFlag(FLAGS_read_fraction);
  if (value_size == 0) return UsageError("--value-size must be above 0");
  if (batch_size < 1 || batch_size > 65536) return UsageError("--batch-size must be in 1..65536");
  if (threads < 1 || threads > 1024) return UsageError("--threads must be in 1..1024");
  if (connections < 1) return UsageError("--connections must be at least 1");
  if (!(read_fraction >= 0 && read_fraction <= 1)) {
    return UsageError("--read-fraction must be in [0, 1]");
  }
  if (absl::GetFlag(FLAGS_iterations) == 0 &&
      absl::GetFlag(FLAGS_duration) <= absl::ZeroDuration()) {
    return UsageError("--duration must be above 0 (or give --iterations)");
  }
  ProgressMode progress = ProgressMode::kAuto;
  if (absl::GetFlag(FLAGS_progress) == "on") {
    progress = ProgressMode::kOn;
  } else if (absl::GetFlag(FLAGS_progress) == "off") {
    progress = ProgressMode::kOff;
  } else if (absl::GetFlag(FLAGS_progress) != "auto") {
    return UsageError("--progress is auto, on or off");
  }
  std::vector<std::string> baselines;
  for (absl::string_view name :
       absl::StrSplit(absl::GetFlag(FLAGS_baselines), ',', absl::SkipEmpty())) {
    if (name == "none") continue;
    if (name != "tcp" && name != "memcpy" && name != "redis") {
      return UsageError(absl::StrCat("unknown baseline '", name, "' (tcp, memcpy, redis, none)"));
    }
    baselines.emplace_back(name);
  }

  InstallInterruptHandler();
  Report report;
  report.notes.push_back(absl::StrCat("load average at start: ", LoadAverage(), " on ",
                                      sysconf(_SC_NPROCESSORS_ONLN), " CPUs"));

  // Logs of the servers the bench starts.
  char log_template[] = "/tmp/kvpool-bench.XXXXXX";
  std::string log_dir = mkdtemp(log_template) != nullptr ? log_template : "/tmp";
  bool keep_logs = absl::GetFlag(FLAGS_keep_logs);

  // The pool: started here, or given.
  std::string master = absl::GetFlag(FLAGS_master);
  LocalPool pool;
  if (absl::GetFlag(FLAGS_start_pool)) {
    LocalPoolOptions options;
    absl::StatusOr<std::string> master_binary = FindBinary(
        absl::GetFlag(FLAGS_master_bin), {"../server/master/kvpool-master", "kvpool-master"});
    if (!master_binary.ok()) return SetupError(master_binary.status());
    options.master_binary = *master_binary;
    options.segments = absl::GetFlag(FLAGS_segments);
    if (options.segments > 0) {
      absl::StatusOr<std::string> segment_binary = FindBinary(
          absl::GetFlag(FLAGS_segment_bin), {"../server/segment/kvpool-segment", "kvpool-segment"});
      if (!segment_binary.ok()) return SetupError(segment_binary.status());
      options.segment_binary = *segment_binary;
    }
    options.pool_bytes = absl::GetFlag(FLAGS_pool_size).bytes;
    options.server_threads = absl::GetFlag(FLAGS_server_threads);
    options.master_args = Words(absl::GetFlag(FLAGS_master_args));
    options.segment_args = Words(absl::GetFlag(FLAGS_segment_args));
    options.log_dir = log_dir;
    if (progress != ProgressMode::kOff && !absl::GetFlag(FLAGS_json)) {
      std::fprintf(stderr, "kvpool-bench: starting a pool of %s (logs in %s)\n",
                   FormatSize(options.pool_bytes).c_str(), log_dir.c_str());
    }
    absl::StatusOr<LocalPool> started = StartLocalPool(options);
    if (!started.ok()) return SetupError(started.status());
    pool = std::move(*started);
    master = pool.master;
  }

  KvpoolTargetOptions kvpool_options{.master = master,
                                     .transport = *transport,
                                     .transport_name = absl::GetFlag(FLAGS_transport),
                                     .connections_per_segment = connections,
                                     .shared_client = absl::GetFlag(FLAGS_shared_client),
                                     .verify_checksums = absl::GetFlag(FLAGS_verify_checksums),
                                     .cache_locations = absl::GetFlag(FLAGS_cache_locations),
                                     .read_by_key = absl::GetFlag(FLAGS_read_by_key)};
  if (absl::Status credentials = ApplyCredentialFlags(kvpool_options.credentials);
      !credentials.ok()) {
    return SetupError(credentials);
  }
  absl::StatusOr<std::unique_ptr<KvpoolTarget>> kvpool = KvpoolTarget::Connect(kvpool_options);
  if (!kvpool.ok()) return SetupError(kvpool.status());
  absl::StatusOr<ClusterStatus> cluster = (*kvpool)->client().GetClusterStatus();
  if (!cluster.ok()) return SetupError(cluster.status());
  int segments = std::max<int>(1, static_cast<int>(cluster->segments.size()));
  uint64_t capacity = cluster->capacity_bytes - cluster->used_bytes;

  // The working set of the data workloads: about 512 MiB, far above any cache, and at most
  // half of the free pool so that puts have room beside it.
  uint64_t keys = absl::GetFlag(FLAGS_keys);
  uint64_t fits = capacity / 2 / value_size;
  if (keys == 0) {
    keys = std::min<uint64_t>(std::max<uint64_t>((512ull << 20) / value_size, 4ull * batch_size),
                              fits);
  }
  if (keys == 0) {
    return SetupError(absl::ResourceExhaustedError(
        absl::StrCat("the pool has ", FormatSize(capacity), " free: too small for ",
                     FormatSize(value_size), " values")));
  }
  if (keys > fits) {
    report.notes.push_back(absl::StrCat("--keys=", keys, " of ", FormatSize(value_size),
                                        " is more than half of the free pool (",
                                        FormatSize(capacity), "): expect evictions"));
  }

  // Baselines, each started once for the whole run.
  std::vector<std::unique_ptr<System>> systems;
  RedisBaseline* redis = nullptr;
  std::vector<Result> failures;
  for (const std::string& name : baselines) {
    if (name == "tcp") {
      int buffer = static_cast<int>(absl::GetFlag(FLAGS_tcp_socket_buffer).bytes);
      absl::StatusOr<std::unique_ptr<TcpBaseline>> tcp = TcpBaseline::Start(buffer, false);
      if (!tcp.ok()) return SetupError(tcp.status());
      systems.push_back(std::move(*tcp));
      // A single-value get is judged by its latency: add the bare round trip.
      if (batch_size == 1) {
        absl::StatusOr<std::unique_ptr<TcpBaseline>> rtt = TcpBaseline::Start(buffer, true);
        if (!rtt.ok()) return SetupError(rtt.status());
        systems.push_back(std::move(*rtt));
      }
    } else if (name == "memcpy") {
      systems.push_back(
          std::make_unique<MemcpyBaseline>(absl::GetFlag(FLAGS_memcpy_working_set).bytes));
    } else if (name == "redis") {
      absl::StatusOr<std::unique_ptr<RedisBaseline>> started;
      if (!absl::GetFlag(FLAGS_redis).empty()) {
        started = RedisBaseline::Connect(absl::GetFlag(FLAGS_redis));
      } else {
        absl::StatusOr<std::string> binary =
            FindBinary(absl::GetFlag(FLAGS_redis_bin), {"redis-server"});
        started = binary.ok() ? RedisBaseline::Launch(*binary, log_dir + "/redis-server.log")
                              : absl::StatusOr<std::unique_ptr<RedisBaseline>>(binary.status());
      }
      if (!started.ok()) {
        // Reported in every workload's table; the other systems still run.
        failures.push_back(
            Result{.system = "redis", .failure = std::string(started.status().message())});
        continue;
      }
      redis = started->get();
      systems.push_back(std::move(*started));
    }
  }

  RunOptions run_options{.warmup = absl::GetFlag(FLAGS_warmup),
                         .duration = absl::GetFlag(FLAGS_duration),
                         .iterations = absl::GetFlag(FLAGS_iterations),
                         .progress = progress};
  std::string run_id = RandomRunId();
  // Every server the bench started: their memory is reported, and their CPU time is the
  // run's, not someone else's.
  for (const std::unique_ptr<ChildProcess>& process : pool.processes) {
    report.servers.push_back({.name = process->name(), .pid = process->pid()});
  }
  if (redis != nullptr && redis->process() != nullptr) {
    report.servers.push_back({.name = "redis-server", .pid = redis->process()->pid()});
  }
  std::vector<pid_t> server_pids;
  for (ServerMemory& server : report.servers) {
    server.start = ReadMemoryUse(server.pid);
    server_pids.push_back(server.pid);
  }
  bool first_run = true;
  uint64_t process_peak = 0;
  for (WorkloadKind kind : *kinds) {
    if (Interrupted()) break;
    bool meta = IsMetaWorkload(kind);
    Workload workload{.kind = kind,
                      .value_size = value_size,
                      .batch_size = batch_size,
                      .threads = threads,
                      .lanes = connections * segments,
                      .read_fraction = read_fraction,
                      .keys = meta && absl::GetFlag(FLAGS_keys) == 0 ? 16384 : keys,
                      .client_buffer_bytes = std::max<uint64_t>(
                          absl::GetFlag(FLAGS_client_buffer).bytes, value_size * batch_size),
                      .run_id = run_id};
    if (first_run) report.client_start = ReadMemoryUse(0);
    first_run = false;
    // With --quiet-below, a run that others disturbed is measured again; the quietest counts.
    const double quiet_below = absl::GetFlag(FLAGS_quiet_below);
    auto measure = [&](System& system) {
      Result best;
      int attempts = quiet_below > 0 ? std::max(1, absl::GetFlag(FLAGS_quiet_attempts)) : 1;
      for (int attempt = 0; attempt < attempts && !Interrupted(); ++attempt) {
        Result result =
            RunOne(system, workload, run_options, server_pids, quiet_below, process_peak);
        double others = result.cpu.others + result.cpu.steal;
        if (attempt == 0 || others < best.cpu.others + best.cpu.steal) best = std::move(result);
        if (!best.failure.empty() || others < quiet_below) break;
      }
      report.results.push_back(std::move(best));
    };
    measure(**kvpool);
    for (const std::unique_ptr<System>& system : systems) {
      if (Interrupted()) break;
      if (system->Supports(kind)) measure(*system);
    }
    for (const Result& failure : failures) {
      Result row = failure;
      row.workload = workload;
      report.results.push_back(row);
    }
  }
  report.client_end = ReadMemoryUse(0);
  report.client_peak_bytes = std::max(process_peak, report.client_end.peak_bytes);

  for (ServerMemory& server : report.servers) server.end = ReadMemoryUse(server.pid);
  (*kvpool)->Cleanup();
  if (redis != nullptr) redis->Cleanup();
  report.notes.push_back(absl::StrCat("load average at end: ", LoadAverage()));
  if (Interrupted()) report.notes.push_back("interrupted: the last run was cut short");

  bool errors = !failures.empty();
  for (const Result& result : report.results) {
    errors = errors || !result.failure.empty() || result.stats.errors > 0;
  }
  report.config = {
      {"workloads", absl::GetFlag(FLAGS_workloads)},
      {"value_size", absl::StrCat(value_size)},
      {"batch_size", absl::StrCat(batch_size)},
      {"threads", absl::StrCat(threads)},
      {"connections_per_segment", absl::StrCat(connections)},
      {"segments", absl::StrCat(segments)},
      {"keys", absl::StrCat(keys)},
      {"transport", absl::GetFlag(FLAGS_transport)},
      {"shared_client", absl::GetFlag(FLAGS_shared_client) ? "true" : "false"},
      {"duration", absl::FormatDuration(run_options.duration)},
      {"iterations", absl::StrCat(run_options.iterations)},
      {"warmup", absl::FormatDuration(run_options.warmup)},
      {"baselines", absl::StrJoin(baselines, ",")},
      {"master", master},
      {"started_pool", absl::GetFlag(FLAGS_start_pool) ? "true" : "false"},
      {"pool_free_bytes", absl::StrCat(capacity)},
  };
  std::string json = FormatJson(report);
  if (std::string path = absl::GetFlag(FLAGS_json_out); !path.empty()) {
    std::ofstream file(path, std::ios::trunc);
    file << json;
    if (!file.good()) std::fprintf(stderr, "kvpool-bench: cannot write %s\n", path.c_str());
  }
  std::string out = absl::GetFlag(FLAGS_json) ? json : FormatTable(report);
  std::fwrite(out.data(), 1, out.size(), stdout);
  std::fflush(stdout);

  // Stop the servers, the segments (all at once) before the master, which they unmount
  // from, and tidy the logs.
  kvpool->reset();
  for (size_t i = 1; i < pool.processes.size(); ++i) pool.processes[i]->Terminate();
  for (auto process = pool.processes.rbegin(); process != pool.processes.rend(); ++process) {
    (*process)->Stop();
  }
  systems.clear();
  if (!keep_logs && !errors) {
    for (const char* name : {"kvpool-master.log", "redis-server.log"}) {
      unlink(absl::StrCat(log_dir, "/", name).c_str());
    }
    for (int i = 0; i < absl::GetFlag(FLAGS_segments); ++i) {
      unlink(absl::StrCat(log_dir, "/kvpool-segment-", i, ".log").c_str());
    }
    rmdir(log_dir.c_str());
  } else if (errors) {
    std::fprintf(stderr, "kvpool-bench: some runs failed or had errors; server logs in %s\n",
                 log_dir.c_str());
  }
  if (Interrupted()) return 130;
  return errors ? 1 : 0;
}

}  // namespace
}  // namespace kvpool::bench

int main(int argc, char** argv) { return kvpool::bench::Main(argc, argv); }
