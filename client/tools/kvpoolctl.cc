// kvpoolctl: the operator's and developer's command line for a kvpool pool.
//
//   kvpoolctl [--master ADDR] [--json] COMMAND ...
//     put KEY FILE|-        store the file (or stdin) under KEY
//     get KEY [FILE|-]      fetch KEY into the file (default: stdout)
//     exists KEY...         whether each key is stored
//     rm KEY...             remove keys
//     status                capacity, use, objects, segments
//     segments              one line per segment
//
// Exit status: 0 success, 1 the operation failed (not found, pressure, ...), 2 usage error.

#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>

#include "absl/flags/flag.h"
#include "common/flags.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/size.h"
#include "kvpool/client.h"

ABSL_FLAG(std::string, master, "127.0.0.1:50051", "gRPC address of kvpool-master");
ABSL_FLAG(bool, json, false, "Print results as JSON, for scripts");
ABSL_FLAG(absl::Duration, timeout, absl::Seconds(10), "Deadline of each call");
ABSL_FLAG(uint32_t, replicas, 1, "put: copies on distinct segments");

namespace {

constexpr char kUsage[] =
    "kvpoolctl [--master ADDR] [--json] COMMAND ...\n"
    "  put KEY FILE|-      store the file (or stdin) under KEY\n"
    "  get KEY [FILE|-]    fetch KEY into the file (default: stdout)\n"
    "  exists KEY...       whether each key is stored\n"
    "  rm KEY...           remove keys\n"
    "  status              capacity, use, objects, segments\n"
    "  segments            one line per segment";

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

int Report(const absl::Status& status, absl::string_view what) {
  if (absl::GetFlag(FLAGS_json)) {
    std::printf("{\"ok\":false,\"code\":%d,\"error\":%s,\"message\":%s}\n",
                kvpool::ToErrorCode(status), JsonString(kvpool::ErrorCodeName(kvpool::ToErrorCode(status))).c_str(),
                JsonString(status.message()).c_str());
  } else {
    std::fprintf(stderr, "kvpoolctl: %s: %s (%s)\n", std::string(what).c_str(),
                 std::string(status.message()).c_str(),
                 kvpool::ErrorCodeName(kvpool::ToErrorCode(status)).c_str());
  }
  return 1;
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
  absl::Status status =
      client.Put(args[1], *value, kvpool::PutOptions{.replicas = absl::GetFlag(FLAGS_replicas)});
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
  absl::StatusOr<std::string> value = client.Get(args[1]);
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
  std::vector<absl::Status> results = client.BatchRemove(keys);
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
      std::printf(
          "{\"capacity_bytes\":%llu,\"used_bytes\":%llu,\"objects\":%llu,\"pending_objects\":%llu,"
          "\"segments\":%s}\n",
          static_cast<unsigned long long>(status->capacity_bytes),
          static_cast<unsigned long long>(status->used_bytes),
          static_cast<unsigned long long>(status->objects),
          static_cast<unsigned long long>(status->pending_objects), segments.c_str());
    }
    return 0;
  }
  if (!segments_only) {
    double percent = status->capacity_bytes
                         ? 100.0 * static_cast<double>(status->used_bytes) /
                               static_cast<double>(status->capacity_bytes)
                         : 0;
    std::printf("master     %s\n", absl::GetFlag(FLAGS_master).c_str());
    std::printf("capacity   %s\n", kvpool::FormatSize(status->capacity_bytes).c_str());
    std::printf("used       %s (%.1f%%)\n", kvpool::FormatSize(status->used_bytes).c_str(), percent);
    std::printf("objects    %llu (+%llu being written)\n",
                static_cast<unsigned long long>(status->objects),
                static_cast<unsigned long long>(status->pending_objects));
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
      command != "status" && command != "segments") {
    return Usage(absl::StrCat("unknown command \"", command, "\""));
  }

  kvpool::ClientOptions options;
  options.master_address = absl::GetFlag(FLAGS_master);
  options.rpc_timeout = absl::GetFlag(FLAGS_timeout);
  options.transfer_timeout = absl::GetFlag(FLAGS_timeout);
  options.connect_timeout = absl::GetFlag(FLAGS_timeout);
  absl::StatusOr<std::unique_ptr<kvpool::Client>> client = kvpool::Client::Create(options);
  if (!client.ok()) return Report(client.status(), "connect");

  if (command == "put") return Put(**client, args);
  if (command == "get") return Get(**client, args);
  if (command == "exists") return Exists(**client, args);
  if (command == "rm") return Remove(**client, args);
  if (args.size() != 1) return Usage(absl::StrCat(command, " takes no arguments"));
  return Status(**client, command == "segments");
}
