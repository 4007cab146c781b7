// kvpoolctl: the operator's and developer's command line for a kvpool pool.
//
//   kvpoolctl [--master ADDR] [--json] COMMAND ...
//     put KEY FILE|-        store the file (or stdin) under KEY
//     get KEY [FILE|-]      fetch KEY into the file (default: stdout)
//     exists KEY...         whether each key is stored
//     rm [--force] KEY...   remove keys (--force: even leased ones)
//     status                capacity, use, objects, leases, pins, evictions, segments
//     segments              one line per segment
//     drain SEGMENT         stop placing objects on a segment; it leaves when idle
//
// Exit status: 0 success, 1 the operation failed (not found, pressure, ...), 2 usage error,
// 3 the master refused the credentials (UNAUTHENTICATED) or the role (PERMISSION_DENIED).

#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>

#include "absl/flags/flag.h"
#include "common/flags.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_format.h"
#include "common/size.h"
#include "client/tools/credential_flags.h"
#include "kvpool/client.h"

ABSL_FLAG(std::string, master, "127.0.0.1:50051",
          "gRPC address of kvpool-master: host:port, a comma-separated list of masters, or "
          "etcd://host:port[,host:port] (the leader is found and followed)");
ABSL_FLAG(bool, json, false, "Print results as JSON, for scripts");
ABSL_FLAG(absl::Duration, timeout, absl::Seconds(10), "Deadline of each call");
ABSL_FLAG(std::string, transport, "auto",
          "How bytes move: auto (shared memory with segments on this machine, else TCP), tcp, shm");
ABSL_FLAG(uint32_t, replicas, 1, "put: copies on distinct segments");
ABSL_FLAG(std::string, pin, "none", "put: none, soft (evicted last) or hard (never evicted)");
ABSL_FLAG(bool, force, false, "rm: remove even objects that readers hold a lease on");
ABSL_FLAG(bool, migrate, true,
          "drain: copy the segment's objects to other segments first (false: drop them; those "
          "with a replica elsewhere stay readable)");

namespace {

constexpr char kUsage[] =
    "kvpoolctl [--master ADDR] [--json] COMMAND ...\n"
    "  put KEY FILE|-      store the file (or stdin) under KEY\n"
    "  get KEY [FILE|-]    fetch KEY into the file (default: stdout)\n"
    "  exists KEY...       whether each key is stored\n"
    "  rm [--force] KEY... remove keys (--force: even leased ones)\n"
    "  status              capacity, use, objects, leases, pins, evictions, segments\n"
    "  segments            one line per segment\n"
    "  drain SEGMENT       stop placing objects on a segment; it leaves when idle\n"
    "  put options: --replicas=N --pin=none|soft|hard";

std::string JsonString(absl::string_view text) {
  std::string out = "\"";
  for (char c : text) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += absl::StrFormat("\\u%04x", c);
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

int Usage(absl::string_view problem) {
  std::fprintf(stderr, "kvpoolctl: %s\n%s\n", std::string(problem).c_str(), kUsage);
  return 2;
}

// The name an error is reported under: the master's refusals of the caller's credentials
// or role by their gRPC names (UNAUTHENTICATED, PERMISSION_DENIED), whatever wire code they
// carry; everything else by its error code.
std::string ErrorName(const absl::Status& status) {
  if (absl::IsUnauthenticated(status)) return "UNAUTHENTICATED";
  if (absl::IsPermissionDenied(status)) return "PERMISSION_DENIED";
  return kvpool::ErrorCodeName(kvpool::ToErrorCode(status));
}

// Exit status 1 for a failed command, 3 when the master refused the credentials or the role.
int Report(const absl::Status& status, absl::string_view what) {
  if (absl::GetFlag(FLAGS_json)) {
    std::printf("{\"ok\":false,\"code\":%d,\"error\":%s,\"message\":%s}\n",
                kvpool::ToErrorCode(status), JsonString(ErrorName(status)).c_str(),
                JsonString(status.message()).c_str());
  } else {
    std::fprintf(stderr, "kvpoolctl: %s: %s (%s)\n", std::string(what).c_str(),
                 std::string(status.message()).c_str(), ErrorName(status).c_str());
  }
  return absl::IsUnauthenticated(status) || absl::IsPermissionDenied(status) ? 3 : 1;
}

absl::StatusOr<std::string> ReadInput(const std::string& path) {
  std::ostringstream data;
  if (path == "-") {
    data << std::cin.rdbuf();
  } else {
    std::ifstream file(path, std::ios::binary);
    if (!file) return absl::NotFoundError(absl::StrCat("cannot open ", path));
    data << file.rdbuf();
  }
  return data.str();
}

int Put(kvpool::Client& client, const std::vector<char*>& args) {
  if (args.size() != 3) return Usage("put takes KEY and FILE (or - for stdin)");
  absl::StatusOr<std::string> value = ReadInput(args[2]);
  if (!value.ok()) return Report(value.status(), "put");
  std::string pin = absl::GetFlag(FLAGS_pin);
  if (pin != "none" && pin != "soft" && pin != "hard") {
    return Usage("--pin is none, soft or hard");
  }
  kvpool::PutOptions options{.replicas = absl::GetFlag(FLAGS_replicas),
                             .pin = pin == "hard"   ? kvpool::PinMode::kHard
                                    : pin == "soft" ? kvpool::PinMode::kSoft
                                                    : kvpool::PinMode::kNone};
  absl::Status status = client.Put(args[1], *value, options);
  if (!status.ok()) return Report(status, absl::StrCat("put ", args[1]));
  if (absl::GetFlag(FLAGS_json)) {
    std::printf("{\"ok\":true,\"key\":%s,\"bytes\":%zu}\n", JsonString(args[1]).c_str(),
                value->size());
  } else {
    std::printf("stored %s (%s)\n", args[1], kvpool::FormatSize(value->size()).c_str());
  }
  return 0;
}

int Get(kvpool::Client& client, const std::vector<char*>& args) {
  if (args.size() < 2 || args.size() > 3) return Usage("get takes KEY and optionally FILE");
  // Always checked: a person reading a value wants the bytes that were written, or an error.
  absl::StatusOr<std::string> value = client.Get(args[1], {.verify_checksum = true});
  if (!value.ok()) return Report(value.status(), absl::StrCat("get ", args[1]));
  std::string path = args.size() == 3 ? args[2] : "-";
  if (path == "-") {
    std::fwrite(value->data(), 1, value->size(), stdout);
    std::fflush(stdout);
    return 0;
  }
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  file.write(value->data(), static_cast<std::streamsize>(value->size()));
  if (!file.good()) return Report(absl::UnavailableError(absl::StrCat("cannot write ", path)), "get");
  if (absl::GetFlag(FLAGS_json)) {
    std::printf("{\"ok\":true,\"key\":%s,\"bytes\":%zu}\n", JsonString(args[1]).c_str(),
                value->size());
  }
  return 0;
}

int Exists(kvpool::Client& client, const std::vector<char*>& args) {
  if (args.size() < 2) return Usage("exists takes at least one KEY");
  std::vector<std::string> keys(args.begin() + 1, args.end());
  std::vector<absl::StatusOr<bool>> results = client.BatchExist(keys);
  int exit_code = 0;
  std::string json = "{";
  for (size_t i = 0; i < keys.size(); ++i) {
    if (!results[i].ok()) exit_code = Report(results[i].status(), absl::StrCat("exists ", keys[i]));
    bool exists = results[i].ok() && *results[i];
    if (absl::GetFlag(FLAGS_json)) {
      absl::StrAppend(&json, i ? "," : "", JsonString(keys[i]), ":", exists ? "true" : "false");
    } else if (results[i].ok()) {
      std::printf("%s\t%s\n", keys[i].c_str(), exists ? "yes" : "no");
    }
  }
  if (absl::GetFlag(FLAGS_json)) std::printf("%s}\n", json.c_str());
  return exit_code;
}

int Remove(kvpool::Client& client, const std::vector<char*>& args) {
  if (args.size() < 2) return Usage("rm takes at least one KEY");
  std::vector<std::string> keys(args.begin() + 1, args.end());
  std::vector<absl::Status> results = client.BatchRemove(keys, absl::GetFlag(FLAGS_force));
  int exit_code = 0;
  std::string json = "{";
  for (size_t i = 0; i < keys.size(); ++i) {
    if (absl::GetFlag(FLAGS_json)) {
      absl::StrAppend(&json, i ? "," : "", JsonString(keys[i]), ":", kvpool::ToErrorCode(results[i]));
      if (!results[i].ok()) exit_code = 1;
    } else if (results[i].ok()) {
      std::printf("removed %s\n", keys[i].c_str());
    } else {
      exit_code = Report(results[i], absl::StrCat("rm ", keys[i]));
    }
  }
  if (absl::GetFlag(FLAGS_json)) std::printf("%s}\n", json.c_str());
  return exit_code;
}

int Drain(kvpool::Client& client, const std::vector<char*>& args) {
  if (args.size() != 2) return Usage("drain takes one SEGMENT name (see kvpoolctl segments)");
  const bool json = absl::GetFlag(FLAGS_json);
  kvpool::DrainOptions options{.migrate = absl::GetFlag(FLAGS_migrate)};
  if (!json) {
    options.progress = [](const kvpool::DrainReport& so_far) {
      std::fprintf(stderr, "\rmoved %llu objects (%s)",
                   static_cast<unsigned long long>(so_far.moved_objects),
                   kvpool::FormatSize(so_far.moved_bytes).c_str());
    };
  }
  absl::StatusOr<kvpool::DrainReport> report = client.DrainSegment(args[1], options);
  if (!json && report.ok() && report->moved_objects > 0) std::fprintf(stderr, "\n");
  if (!report.ok()) return Report(report.status(), absl::StrCat("drain ", args[1]));
  if (json) {
    std::printf(
        "{\"ok\":true,\"segment\":%s,\"moved_objects\":%llu,\"moved_bytes\":%llu,"
        "\"failed_copies\":%llu,\"unplaceable\":%llu}\n",
        JsonString(args[1]).c_str(), static_cast<unsigned long long>(report->moved_objects),
        static_cast<unsigned long long>(report->moved_bytes),
        static_cast<unsigned long long>(report->failed_copies),
        static_cast<unsigned long long>(report->unplaceable));
  } else if (options.migrate) {
    std::printf("draining %s: moved %llu objects (%s) to other segments, %llu could not move "
                "and leave with it; it leaves once nothing on it is leased\n",
                args[1], static_cast<unsigned long long>(report->moved_objects),
                kvpool::FormatSize(report->moved_bytes).c_str(),
                static_cast<unsigned long long>(report->unplaceable));
  } else {
    std::printf("draining %s: it takes no new objects and leaves once nothing on it is leased\n",
                args[1]);
  }
  return 0;
}

std::string SegmentJson(const kvpool::SegmentStatus& s) {
  return absl::StrCat("{\"name\":", JsonString(s.name), ",\"host\":", JsonString(s.host),
                      ",\"endpoint\":", JsonString(s.endpoint),
                      ",\"capacity_bytes\":", s.capacity_bytes, ",\"used_bytes\":", s.used_bytes,
                      ",\"replicas\":", s.replicas, ",\"state\":", JsonString(s.state),
                      ",\"last_heartbeat_age_ms\":",
                      absl::ToInt64Milliseconds(s.last_heartbeat_age), "}");
}

void PrintSegmentTable(const kvpool::ClusterStatus& status) {
  std::printf("%-32s %-24s %12s %12s %9s  %s\n", "SEGMENT", "ENDPOINT", "CAPACITY", "USED",
              "REPLICAS", "STATE");
  for (const kvpool::SegmentStatus& s : status.segments) {
    std::printf("%-32s %-24s %12s %12s %9llu  %s\n", s.name.c_str(), s.endpoint.c_str(),
                kvpool::FormatSize(s.capacity_bytes).c_str(),
                kvpool::FormatSize(s.used_bytes).c_str(),
                static_cast<unsigned long long>(s.replicas), s.state.c_str());
  }
}

int Status(kvpool::Client& client, bool segments_only) {
  absl::StatusOr<kvpool::ClusterStatus> status = client.GetClusterStatus();
  if (!status.ok()) return Report(status.status(), "status");
  if (absl::GetFlag(FLAGS_json)) {
    std::string segments = "[";
    for (size_t i = 0; i < status->segments.size(); ++i) {
      absl::StrAppend(&segments, i ? "," : "", SegmentJson(status->segments[i]));
    }
    segments += "]";
    if (segments_only) {
      std::printf("%s\n", segments.c_str());
    } else {
      std::printf("%s\n",
                  absl::StrCat("{\"capacity_bytes\":", status->capacity_bytes,
                               ",\"used_bytes\":", status->used_bytes,
                               ",\"objects\":", status->objects,
                               ",\"pending_objects\":", status->pending_objects,
                               ",\"leased_objects\":", status->leased_objects,
                               ",\"soft_pinned_objects\":", status->soft_pinned_objects,
                               ",\"hard_pinned_objects\":", status->hard_pinned_objects,
                               ",\"evicted_objects\":", status->evicted_objects,
                               ",\"evicted_bytes\":", status->evicted_bytes,
                               ",\"reclaimed_reservations\":", status->reclaimed_reservations,
                               ",\"get_hits\":", status->get_hits,
                               ",\"get_misses\":", status->get_misses,
                               ",\"put_deduplicated\":", status->put_deduplicated,
                               ",\"put_no_space\":", status->put_no_space,
                               ",\"role\":\"", status->role, "\",\"term\":", status->term,
                               ",\"leader\":\"", status->leader, "\",\"masters\":[",
                               absl::StrJoin(status->masters, ",",
                                             [](std::string* out, const std::string& m) {
                                               absl::StrAppend(out, "\"", m, "\"");
                                             }),
                               "]",
                               ",\"segments\":", segments, "}")
                      .c_str());
    }
    return 0;
  }
  if (!segments_only) {
    double percent = status->capacity_bytes
                         ? 100.0 * static_cast<double>(status->used_bytes) /
                               static_cast<double>(status->capacity_bytes)
                         : 0;
    if (status->role == "single") {
      std::printf("master     %s\n", absl::GetFlag(FLAGS_master).c_str());
    } else {
      // Several masters elected through etcd: who leads, at which term, and who stands by.
      std::vector<std::string> standbys;
      for (const std::string& m : status->masters) {
        if (m != status->leader) standbys.push_back(m);
      }
      std::printf("leader     %s (term %lld)%s\n",
                  status->leader.empty() ? "none (election under way)" : status->leader.c_str(),
                  static_cast<long long>(status->term),
                  status->role == "standby"
                      ? absl::StrCat(", as standby ", status->answered_by, " knows it").c_str()
                      : "");
      std::printf("standbys   %s\n",
                  standbys.empty() ? "none" : absl::StrJoin(standbys, ", ").c_str());
    }
    std::printf("capacity   %s\n", kvpool::FormatSize(status->capacity_bytes).c_str());
    std::printf("used       %s (%.1f%%)\n", kvpool::FormatSize(status->used_bytes).c_str(), percent);
    std::printf("objects    %llu (+%llu being written), %llu leased, %llu soft / %llu hard pinned\n",
                static_cast<unsigned long long>(status->objects),
                static_cast<unsigned long long>(status->pending_objects),
                static_cast<unsigned long long>(status->leased_objects),
                static_cast<unsigned long long>(status->soft_pinned_objects),
                static_cast<unsigned long long>(status->hard_pinned_objects));
    uint64_t lookups = status->get_hits + status->get_misses;
    std::printf("gets       %llu hits, %llu misses (%.1f%% hit rate)\n",
                static_cast<unsigned long long>(status->get_hits),
                static_cast<unsigned long long>(status->get_misses),
                lookups ? 100.0 * static_cast<double>(status->get_hits) / lookups : 0.0);
    std::printf("puts       %llu deduplicated, %llu under pressure (NO_AVAILABLE_HANDLE)\n",
                static_cast<unsigned long long>(status->put_deduplicated),
                static_cast<unsigned long long>(status->put_no_space));
    std::printf("evicted    %llu objects (%s) since the master started\n",
                static_cast<unsigned long long>(status->evicted_objects),
                kvpool::FormatSize(status->evicted_bytes).c_str());
    std::printf("segments   %zu\n\n", status->segments.size());
  }
  PrintSegmentTable(*status);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(kUsage);
  std::vector<char*> args = kvpool::ParseFlags(argc, argv);
  args.erase(args.begin());  // program name
  if (args.empty()) return Usage("no command");
  std::string command = args[0];
  if (command != "put" && command != "get" && command != "exists" && command != "rm" &&
      command != "status" && command != "segments" && command != "drain") {
    return Usage(absl::StrCat("unknown command \"", command, "\""));
  }

  kvpool::ClientOptions options;
  options.master_address = absl::GetFlag(FLAGS_master);
  options.rpc_timeout = absl::GetFlag(FLAGS_timeout);
  options.transfer_timeout = absl::GetFlag(FLAGS_timeout);
  options.connect_timeout = absl::GetFlag(FLAGS_timeout);
  if (absl::Status credentials = kvpool::ApplyCredentialFlags(options); !credentials.ok()) {
    return Report(credentials, "connect");
  }
  std::string transport = absl::GetFlag(FLAGS_transport);
  if (transport == "tcp") {
    options.transport = kvpool::TransportKind::kTcp;
  } else if (transport == "shm") {
    options.transport = kvpool::TransportKind::kSharedMemory;
  } else if (transport != "auto") {
    return Usage("--transport is auto, tcp or shm");
  }
  absl::StatusOr<std::unique_ptr<kvpool::Client>> client = kvpool::Client::Create(options);
  if (!client.ok()) return Report(client.status(), "connect");

  if (command == "put") return Put(**client, args);
  if (command == "get") return Get(**client, args);
  if (command == "exists") return Exists(**client, args);
  if (command == "rm") return Remove(**client, args);
  if (command == "drain") return Drain(**client, args);
  if (args.size() != 1) return Usage(absl::StrCat(command, " takes no arguments"));
  return Status(**client, command == "segments");
}
