#include "client/tools/bench/report.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/size.h"
#include "nlohmann/json.hpp"

namespace kvpool::bench {
namespace {

double GigabytesPerSecond(const RunStats& stats) {
  return stats.seconds > 0 ? static_cast<double>(stats.bytes) / stats.seconds / 1e9 : 0;
}
double OpsPerSecond(const RunStats& stats) {
  return stats.seconds > 0 ? static_cast<double>(stats.ops) / stats.seconds : 0;
}
double Micros(uint64_t nanos) { return static_cast<double>(nanos) / 1e3; }

std::string FormatMicros(uint64_t nanos) {
  double us = Micros(nanos);
  if (us >= 100000) return absl::StrFormat("%.0fms", us / 1000);
  if (us >= 1000) return absl::StrFormat("%.0f", us);
  if (us >= 100) return absl::StrFormat("%.0f", us);
  return absl::StrFormat("%.1f", us);
}

std::string FormatRatio(double ratio) { return ratio > 0 ? absl::StrFormat("%.2fx", ratio) : "-"; }

std::string MiB(uint64_t bytes) {
  return absl::StrFormat("%.0f MiB", static_cast<double>(bytes) / (1 << 20));
}

// "RSS 120 MiB (private 80 MiB)": a mapped pool's pages count in RSS but belong to the segment.
std::string Resident(const MemoryUse& use) {
  return absl::StrCat(MiB(use.rss_bytes), " (private ", MiB(use.anon_bytes), ")");
}

nlohmann::ordered_json MemoryJson(const MemoryUse& use) {
  return {{"rss_bytes", use.rss_bytes},
          {"private_bytes", use.anon_bytes},
          {"shared_bytes", use.shmem_bytes},
          {"peak_bytes", use.peak_bytes}};
}

std::string DescribeWorkload(const Workload& w) {
  std::string kind = WorkloadName(w.kind);
  if (w.kind == WorkloadKind::kMetaPut) {
    return absl::StrCat(kind, ": BatchPutStart of ", w.batch_size, " new keys (",
                        FormatSize(w.value_size), " each) then BatchPutRevoke, ", w.threads,
                        " thread(s)");
  }
  if (w.kind == WorkloadKind::kMetaExist || w.kind == WorkloadKind::kMetaLocal) {
    return absl::StrCat(kind, ": ",
                        w.kind == WorkloadKind::kMetaExist ? "BatchExist" : "BatchGetLocal",
                        " of ", w.batch_size, " keys, ", w.threads, " thread(s), ", w.keys,
                        " keys stored");
  }
  std::string mix = w.kind == WorkloadKind::kMixed
                        ? absl::StrFormat(" (%.0f%% gets)", w.read_fraction * 100)
                        : "";
  return absl::StrCat(kind, mix, ": ", FormatSize(w.value_size), " values, batches of ",
                      w.batch_size, ", ", w.threads, " thread(s), working set ", w.keys,
                      " values (", FormatSize(w.keys * w.value_size), ")");
}

}  // namespace

std::vector<Ratio> ComputeRatios(const std::vector<Result>& results) {
  std::vector<Ratio> ratios;
  for (const Result& kvpool : results) {
    if (kvpool.system != "kvpool" || !kvpool.failure.empty()) continue;
    for (const Result& other : results) {
      if (other.system == "kvpool" || other.workload.kind != kvpool.workload.kind ||
          !other.failure.empty()) {
        continue;
      }
      Ratio ratio{.workload = WorkloadName(kvpool.workload.kind), .baseline = other.system};
      bool bytes = other.stats.bytes > 0 && kvpool.stats.bytes > 0;
      double mine = bytes ? GigabytesPerSecond(kvpool.stats) : OpsPerSecond(kvpool.stats);
      double theirs = bytes ? GigabytesPerSecond(other.stats) : OpsPerSecond(other.stats);
      // A round-trip baseline moves no values: only its latency compares.
      if (other.stats.bytes > 0 || kvpool.stats.bytes == 0) {
        ratio.throughput = theirs > 0 ? mine / theirs : 0;
      }
      uint64_t their_p50 = other.stats.latency.Quantile(0.5);
      ratio.p50_latency =
          their_p50 > 0 ? static_cast<double>(kvpool.stats.latency.Quantile(0.5)) / their_p50 : 0;
      ratios.push_back(ratio);
    }
  }
  return ratios;
}

std::string FormatTable(const Report& report) {
  std::vector<Ratio> ratios = ComputeRatios(report.results);
  std::string out;
  std::string last;
  for (const Result& result : report.results) {
    std::string title = DescribeWorkload(result.workload);
    if (title != last) {
      absl::StrAppend(&out, "\n", title, "\n",
                      absl::StrFormat("  %-10s %8s %10s %9s %9s %9s %7s %9s %9s %6s  %s\n",
                                      "system", "GB/s", "ops/s", "p50 us", "p99 us", "p99.9 us",
                                      "errors", "kvpool/x", "p50 k/x", "other", "how"));
      last = title;
    }
    if (!result.failure.empty()) {
      absl::StrAppend(&out, absl::StrFormat("  %-10s failed: %s\n", result.system, result.failure));
      continue;
    }
    const RunStats& s = result.stats;
    std::string throughput_ratio = "", latency_ratio = "";
    for (const Ratio& ratio : ratios) {
      if (ratio.baseline == result.system && ratio.workload == WorkloadName(result.workload.kind)) {
        throughput_ratio = FormatRatio(ratio.throughput);
        latency_ratio = FormatRatio(ratio.p50_latency);
      }
    }
    absl::StrAppend(
        &out,
        absl::StrFormat(
            "  %-10s %8s %10.0f %9s %9s %9s %7d %9s %9s %5.0f%%  %s\n", result.system,
            s.bytes > 0 ? absl::StrFormat("%.3f", GigabytesPerSecond(s)) : "-", OpsPerSecond(s),
            FormatMicros(s.latency.Quantile(0.5)), FormatMicros(s.latency.Quantile(0.99)),
            FormatMicros(s.latency.Quantile(0.999)), s.errors, throughput_ratio, latency_ratio,
            (result.cpu.others + result.cpu.steal) * 100, result.detail));
    if (s.errors > 0) absl::StrAppend(&out, "    first error: ", s.first_error, "\n");
    if (result.noisy) {
      absl::StrAppend(&out, "    (the machine was not quiet when this run began)\n");
    }
  }
  absl::StrAppend(&out,
                  "\nGB/s is 10^9 bytes of values per second; ops are values (keys for meta-*); "
                  "latency is per call (one batch, or one connection's share of it).\n"
                  "kvpool/x: kvpool's throughput over that system's; p50 k/x: kvpool's p50 "
                  "latency over its.\nother: CPU time of the machine that other processes (or "
                  "the hypervisor) took while it ran; above a few percent, numbers are noisy.\n"
                  "(Servers the bench did not start itself, given by --master or --redis, count "
                  "as other.)\n");
  absl::StrAppend(&out, "\nmemory\n");
  absl::StrAppend(&out, "  bench process: RSS ", Resident(report.client_start), " at the start, ",
                  Resident(report.client_end), " at the end; peak ", MiB(report.client_peak_bytes),
                  " (baselines' buffers included)\n");
  for (const Result& result : report.results) {
    if (result.system != "kvpool" || !result.failure.empty()) continue;
    absl::StrAppend(&out, "  kvpool client, ", WorkloadName(result.workload.kind), ": RSS ",
                    Resident(result.memory_before), " when measuring began, ",
                    Resident(result.memory_after), " when it ended; peak ", MiB(result.peak_bytes),
                    "\n");
  }
  for (const ServerMemory& server : report.servers) {
    absl::StrAppend(&out, "  ", server.name, " (pid ", server.pid, "): RSS ",
                    Resident(server.start), " at the start, ", Resident(server.end),
                    " at the end; peak ", MiB(server.end.peak_bytes), "\n");
  }
  for (const std::string& note : report.notes) absl::StrAppend(&out, "note: ", note, "\n");
  return out;
}

std::string FormatJson(const Report& report) {
  nlohmann::ordered_json json;
  json["tool"] = "kvpool-bench";
  nlohmann::ordered_json config = nlohmann::ordered_json::object();
  for (const auto& [key, value] : report.config) config[key] = value;
  json["config"] = config;
  nlohmann::ordered_json results = nlohmann::ordered_json::array();
  for (const Result& result : report.results) {
    const RunStats& s = result.stats;
    nlohmann::ordered_json one;
    one["workload"] = WorkloadName(result.workload.kind);
    one["system"] = result.system;
    one["detail"] = result.detail;
    one["value_size"] = result.workload.value_size;
    one["batch_size"] = result.workload.batch_size;
    one["threads"] = result.workload.threads;
    one["keys"] = result.workload.keys;
    if (!result.failure.empty()) {
      one["failure"] = result.failure;
      results.push_back(one);
      continue;
    }
    one["calls"] = s.calls;
    one["ops"] = s.ops;
    one["bytes"] = s.bytes;
    one["errors"] = s.errors;
    if (s.errors > 0) one["first_error"] = s.first_error;
    one["seconds"] = s.seconds;
    one["gb_per_s"] = GigabytesPerSecond(s);
    one["ops_per_s"] = OpsPerSecond(s);
    one["calls_per_s"] = s.seconds > 0 ? static_cast<double>(s.calls) / s.seconds : 0;
    one["latency_us"] = {{"p50", Micros(s.latency.Quantile(0.5))},
                         {"p99", Micros(s.latency.Quantile(0.99))},
                         {"p999", Micros(s.latency.Quantile(0.999))},
                         {"mean", s.latency.mean_nanos() / 1e3},
                         {"max", Micros(s.latency.max_nanos())}};
    one["cpu"] = {{"ours", result.cpu.ours},
                  {"others", result.cpu.others},
                  {"steal", result.cpu.steal},
                  {"started_noisy", result.noisy}};
    if (result.system == "kvpool") {
      one["client_memory"] = {{"before", MemoryJson(result.memory_before)},
                              {"after", MemoryJson(result.memory_after)},
                              {"peak_bytes", result.peak_bytes}};
    }
    results.push_back(one);
  }
  json["results"] = results;
  nlohmann::ordered_json ratios = nlohmann::ordered_json::array();
  for (const Ratio& ratio : ComputeRatios(report.results)) {
    // null where the ratio means nothing (a round-trip baseline moves no values).
    auto number = [](double value) {
      return value > 0 ? nlohmann::ordered_json(value) : nlohmann::ordered_json(nullptr);
    };
    ratios.push_back({{"workload", ratio.workload},
                      {"baseline", ratio.baseline},
                      {"throughput", number(ratio.throughput)},
                      {"p50_latency", number(ratio.p50_latency)}});
  }
  json["ratios"] = ratios;
  nlohmann::ordered_json servers = nlohmann::ordered_json::array();
  for (const ServerMemory& server : report.servers) {
    servers.push_back({{"name", server.name},
                       {"pid", server.pid},
                       {"start", MemoryJson(server.start)},
                       {"end", MemoryJson(server.end)}});
  }
  json["memory"] = {{"client",
                     {{"start", MemoryJson(report.client_start)},
                      {"end", MemoryJson(report.client_end)},
                      {"peak_bytes", report.client_peak_bytes}}},
                    {"servers", servers}};
  json["notes"] = report.notes;
  return json.dump(2) + "\n";
}

}  // namespace kvpool::bench
