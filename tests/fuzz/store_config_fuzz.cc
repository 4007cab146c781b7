// libFuzzer target: the Mooncake JSON configuration parser (engine_plugin/store_config.h) on
// arbitrary text, as MOONCAKE_CONFIG_PATH's file or a JSON string reaches it. Never a crash or
// an exception; a refusal is InvalidArgument; an accepted config has a master address and a
// protocol of tcp or rdma, and parses to the same config again.

#include <cstdint>
#include <cstdlib>
#include <string>

#include "engine_plugin/store_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using kvpool::engine::ParseStoreConfigJson;
  using kvpool::engine::StoreConfig;
  std::string text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<StoreConfig> config = ParseStoreConfigJson(text);
  if (!config.ok()) {
    if (config.status().code() != absl::StatusCode::kInvalidArgument) std::abort();
    return 0;
  }
  if (config->master_server_address.empty()) std::abort();
  if (config->protocol != "tcp" && config->protocol != "rdma") std::abort();
  absl::StatusOr<StoreConfig> again = ParseStoreConfigJson(text);
  if (!again.ok() || again->master_server_address != config->master_server_address ||
      again->global_segment_size != config->global_segment_size ||
      again->replica_num != config->replica_num) {
    std::abort();
  }
  return 0;
}
