#include "engine_plugin/store_config.h"

#include <cstdlib>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvpool::engine {
namespace {

using ::testing::HasSubstr;

TEST(StoreConfigTest, ParsesMooncakeConfigFile) {
  // The file vLLM's MooncakeStoreConnector documentation shows.
  absl::StatusOr<StoreConfig> config = ParseStoreConfigJson(R"({
    "metadata_server": "P2PHANDSHAKE",
    "master_server_address": "127.0.0.1:50051",
    "global_segment_size": "80GB",
    "local_buffer_size": "4GB",
    "protocol": "rdma",
    "device_name": ""
  })");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->master_server_address, "127.0.0.1:50051");
  EXPECT_EQ(config->global_segment_size, uint64_t{80} << 30);
  EXPECT_EQ(config->local_buffer_size, uint64_t{4} << 30);
  EXPECT_EQ(config->protocol, "rdma");
  EXPECT_EQ(config->metadata_server, "P2PHANDSHAKE");
  EXPECT_EQ(config->replica_num, 1u);
}

TEST(StoreConfigTest, AcceptsSetupKeysNumbersAndDefaults) {
  // MooncakeDistributedStore.setup's dict: sizes as decimal strings, other key names.
  absl::StatusOr<StoreConfig> config = ParseStoreConfig({
      {"local_hostname", std::string("127.0.0.1")},
      {"metadata_server", std::string("P2PHANDSHAKE")},
      {"global_segment_size", std::string("1073741824")},
      {"local_buffer_size", int64_t{0}},
      {"protocol", std::string("tcp")},
      {"rdma_devices", std::string("mlx5_0")},
      {"master_server_addr", std::string("10.0.0.1:50051")},
  });
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->global_segment_size, uint64_t{1} << 30);
  EXPECT_EQ(config->local_buffer_size, 0u);
  EXPECT_EQ(config->device_name, "mlx5_0");
  EXPECT_EQ(config->master_server_address, "10.0.0.1:50051");
  EXPECT_EQ(config->local_hostname, "127.0.0.1");

  config = ParseStoreConfigJson(R"({"master_server_address": "m:1", "global_segment_size": 512.0,
                                    "replica_num": 2})");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->global_segment_size, 512u);
  EXPECT_EQ(config->local_buffer_size, uint64_t{4} << 30);  // vLLM's default
  EXPECT_EQ(config->protocol, "tcp");
  EXPECT_EQ(config->replica_num, 2u);
}

TEST(StoreConfigTest, RefusesUnknownAndMalformedValues) {
  auto error = [](absl::string_view json) {
    absl::StatusOr<StoreConfig> config = ParseStoreConfigJson(json);
    EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument) << json;
    return std::string(config.status().message());
  };
  EXPECT_THAT(error(R"({"master_server_address": "m:1", "global_segmnet_size": 1})"),
              HasSubstr("unknown key \"global_segmnet_size\""));
  EXPECT_THAT(error(R"({"master_server_address": "m:1", "global_segment_size": "4 GX"})"),
              HasSubstr("global_segment_size = \"4 GX\""));
  EXPECT_THAT(error(R"({"master_server_address": "m:1", "local_buffer_size": -1})"),
              HasSubstr("cannot be negative"));
  EXPECT_THAT(error(R"({"master_server_address": "m:1", "global_segment_size": true})"),
              HasSubstr("expected a size"));
  EXPECT_THAT(error(R"({"master_server_address": "m:1", "protocol": "nvlink"})"),
              HasSubstr("supported protocols"));
  // Several masters elected through etcd: a list, or etcd:// (the leader is followed).
  for (const char* several : {"m1:50051,m2:50051,m3:50051", "etcd://e1:2379,e2:2379"}) {
    absl::StatusOr<StoreConfig> ha = ParseStoreConfigJson(
        absl::StrCat(R"({"master_server_address": ")", several, R"("})"));
    ASSERT_TRUE(ha.ok()) << several << ": " << ha.status();
    EXPECT_EQ(ha->master_server_address, several);
  }
  EXPECT_THAT(error(R"({"master_server_address": "etcd://10.0.0.1"})"),
              HasSubstr("host:port"));
  EXPECT_THAT(error(R"({"master_server_address": "http://10.0.0.1:2379"})"),
              HasSubstr("host:port"));
  EXPECT_THAT(error(R"({"master_server_address": "no-port"})"), HasSubstr("master_server_address"));
  EXPECT_THAT(error(R"({"protocol": "tcp"})"), HasSubstr("master_server_address"));
  EXPECT_THAT(error(R"({"master_server_address": "m:1", "master_server_addr": "m:2"})"),
              HasSubstr("both set the same thing"));
  EXPECT_THAT(error(R"({"master_server_address": ["m:1"]})"), HasSubstr("must be a string"));
  EXPECT_THAT(error(R"({"master_server_address": "m:1",)"), HasSubstr("not valid JSON"));
  EXPECT_THAT(error(R"(["m:1"])"), HasSubstr("JSON object"));
  EXPECT_THAT(error(R"({"master_server_address": "m:1", "replica_num": 0})"),
              HasSubstr("replicas"));
}

TEST(StoreConfigTest, LoadsTheFileNamedByTheEnvironment) {
  std::string path = ::testing::TempDir() + "/mooncake_config.json";
  {
    std::ofstream file(path);
    file << R"({"master_server_address": "127.0.0.1:7", "global_segment_size": "512MB"})";
  }
  setenv("MOONCAKE_CONFIG_PATH", path.c_str(), 1);
  absl::StatusOr<StoreConfig> config = LoadStoreConfigFromEnv();
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->global_segment_size, uint64_t{512} << 20);

  unsetenv("MOONCAKE_CONFIG_PATH");
  EXPECT_EQ(LoadStoreConfigFromEnv().status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(LoadStoreConfigFile(path + ".missing").status().code(), absl::StatusCode::kNotFound);
  {
    std::ofstream file(path);
    file << R"({"master_server_address": 7})";
  }
  EXPECT_THAT(LoadStoreConfigFile(path).status().message(), HasSubstr(path));
}

}  // namespace
}  // namespace kvpool::engine
