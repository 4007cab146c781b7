#pragma once

// How a Store connects: Mooncake-compatible configuration, from the JSON file that
// MOONCAKE_CONFIG_PATH names, from a JSON string, or from the key/value pairs of a Python
// dict (MooncakeDistributedStore.setup's keys). Both vocabularies are accepted:
//
//   key                      alias                meaning
//   master_server_address    master_server_addr   kvpool-master's gRPC "host:port" (required)
//   global_segment_size                           memory this process contributes to the pool
//                                                 as an in-process segment (0: none)
//   local_buffer_size                             accepted; kvpool needs no staging buffer
//   protocol                                      "tcp" or "rdma" (rdma runs over TCP until
//                                                 the RDMA transport lands)
//   device_name              rdma_devices         RDMA device list; accepted, unused for now
//   metadata_server                               accepted, unused: kvpool's master is its
//                                                 own metadata service
//   local_hostname                                host ("ip" or "ip:port") the in-process
//                                                 segment listens on and advertises
//   replica_num                                   copies of each stored chunk (kvpool extra)
//
// Sizes are byte counts or strings such as "4GB", "512MB", "80 GiB" (KB/MB/GB are powers of
// 1024, as in Mooncake). Unknown keys and malformed values are InvalidArgument errors that
// name the key.

#include <cstdint>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kvpool::engine {

struct StoreConfig {
  std::string master_server_address;
  uint64_t global_segment_size = uint64_t{4} << 30;
  uint64_t local_buffer_size = uint64_t{4} << 30;
  std::string protocol = "tcp";
  std::string device_name;
  std::string metadata_server;
  std::string local_hostname;
  uint32_t replica_num = 1;
};

// A JSON scalar (or Python value): null, bool, integer, floating point or string.
using ConfigValue = std::variant<std::monostate, bool, int64_t, double, std::string>;
using ConfigEntries = std::vector<std::pair<std::string, ConfigValue>>;

// Defaults for keys not given are those of StoreConfig (vLLM's: 4 GiB segment and buffer).
absl::StatusOr<StoreConfig> ParseStoreConfig(const ConfigEntries& entries);
// The text must hold one JSON object of scalars.
absl::StatusOr<StoreConfig> ParseStoreConfigJson(absl::string_view json);
// NotFound if the file cannot be read; parse errors name the file.
absl::StatusOr<StoreConfig> LoadStoreConfigFile(const std::string& path);
// The file named by MOONCAKE_CONFIG_PATH; NotFound if the variable is not set.
absl::StatusOr<StoreConfig> LoadStoreConfigFromEnv();

}  // namespace kvpool::engine
