#include "engine_plugin/store_config.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/net.h"
#include "common/size.h"
#include "nlohmann/json.hpp"
#include "proto/master_locator.h"

namespace kvpool::engine {
namespace {

using Setter = absl::Status (*)(const std::string& key, const ConfigValue& value,
                                StoreConfig& config);

std::string Describe(const ConfigValue& value) {
  struct {
    std::string operator()(std::monostate) const { return "null"; }
    std::string operator()(bool b) const { return b ? "true" : "false"; }
    std::string operator()(int64_t i) const { return absl::StrCat(i); }
    std::string operator()(double d) const { return absl::StrCat(d); }
    std::string operator()(const std::string& s) const { return absl::StrCat("\"", s, "\""); }
  } visitor;
  return std::visit(visitor, value);
}

absl::Status Malformed(const std::string& key, const ConfigValue& value, absl::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat("store config: ", key, " = ", Describe(value), ": ", why));
}

absl::StatusOr<std::string> AsString(const std::string& key, const ConfigValue& value) {
  if (const std::string* s = std::get_if<std::string>(&value)) return *s;
  if (std::holds_alternative<std::monostate>(value)) return std::string();
  return Malformed(key, value, "expected a string");
}

absl::StatusOr<uint64_t> AsSize(const std::string& key, const ConfigValue& value) {
  if (const int64_t* i = std::get_if<int64_t>(&value)) {
    if (*i < 0) return Malformed(key, value, "a size cannot be negative");
    return static_cast<uint64_t>(*i);
  }
  if (const double* d = std::get_if<double>(&value)) {
    if (!std::isfinite(*d) || *d < 0 || *d != std::floor(*d) || *d >= 18446744073709551615.0) {
      return Malformed(key, value, "expected a whole, non-negative number of bytes");
    }
    return static_cast<uint64_t>(*d);
  }
  if (const std::string* s = std::get_if<std::string>(&value)) {
    absl::StatusOr<uint64_t> size = ParseSize(*s);
    if (!size.ok()) return Malformed(key, value, size.status().message());
    return *size;
  }
  return Malformed(key, value, "expected a size (bytes, or a string such as \"4GB\")");
}

absl::Status SetMaster(const std::string& key, const ConfigValue& value, StoreConfig& config) {
  absl::StatusOr<std::string> address = AsString(key, value);
  if (!address.ok()) return address.status();
  // host:port, a list of masters, or etcd://host:port[,...] (proto/master_locator.h).
  if (absl::Status valid = ValidateMasterAddress(*address); !valid.ok()) {
    return Malformed(key, value, valid.message());
  }
  config.master_server_address = *address;
  return absl::OkStatus();
}

absl::Status SetGlobalSegmentSize(const std::string& key, const ConfigValue& value,
                                  StoreConfig& config) {
  absl::StatusOr<uint64_t> size = AsSize(key, value);
  if (!size.ok()) return size.status();
  config.global_segment_size = *size;
  return absl::OkStatus();
}

absl::Status SetLocalBufferSize(const std::string& key, const ConfigValue& value,
                                StoreConfig& config) {
  absl::StatusOr<uint64_t> size = AsSize(key, value);
  if (!size.ok()) return size.status();
  config.local_buffer_size = *size;
  return absl::OkStatus();
}

absl::Status SetProtocol(const std::string& key, const ConfigValue& value, StoreConfig& config) {
  absl::StatusOr<std::string> protocol = AsString(key, value);
  if (!protocol.ok()) return protocol.status();
  if (protocol->empty()) protocol = std::string("tcp");
  if (*protocol != "tcp" && *protocol != "rdma") {
    return Malformed(key, value, "supported protocols are \"tcp\" and \"rdma\"");
  }
  config.protocol = *protocol;
  return absl::OkStatus();
}

absl::Status SetDeviceName(const std::string& key, const ConfigValue& value, StoreConfig& config) {
  absl::StatusOr<std::string> name = AsString(key, value);
  if (!name.ok()) return name.status();
  config.device_name = *name;
  return absl::OkStatus();
}

absl::Status SetMetadataServer(const std::string& key, const ConfigValue& value,
                               StoreConfig& config) {
  absl::StatusOr<std::string> server = AsString(key, value);
  if (!server.ok()) return server.status();
  config.metadata_server = *server;
  return absl::OkStatus();
}

absl::Status SetLocalHostname(const std::string& key, const ConfigValue& value,
                              StoreConfig& config) {
  absl::StatusOr<std::string> host = AsString(key, value);
  if (!host.ok()) return host.status();
  // "ip" or "ip:port"; a bare IPv6 literal must be bracketed to carry a port.
  if (host->find(':') != std::string::npos && host->front() != '[' &&
      host->find(':') == host->rfind(':')) {
    if (absl::StatusOr<HostPort> parsed = ParseHostPort(*host); !parsed.ok()) {
      return Malformed(key, value, parsed.status().message());
    }
  }
  config.local_hostname = *host;
  return absl::OkStatus();
}

absl::Status SetReplicaNum(const std::string& key, const ConfigValue& value, StoreConfig& config) {
  int64_t n = 0;
  if (const int64_t* i = std::get_if<int64_t>(&value)) {
    n = *i;
  } else if (const std::string* s = std::get_if<std::string>(&value);
             s == nullptr || !absl::SimpleAtoi(*s, &n)) {
    return Malformed(key, value, "expected a whole number");
  }
  if (n < 1 || n > 64) return Malformed(key, value, "expected 1 to 64 replicas");
  config.replica_num = static_cast<uint32_t>(n);
  return absl::OkStatus();
}

// Every accepted key, its canonical name and its setter.
struct KeySpec {
  const char* canonical;
  Setter setter;
};
const absl::flat_hash_map<std::string, KeySpec>& Keys() {
  static const auto* keys = new absl::flat_hash_map<std::string, KeySpec>{
      {"master_server_address", {"master_server_address", SetMaster}},
      {"master_server_addr", {"master_server_address", SetMaster}},
      {"global_segment_size", {"global_segment_size", SetGlobalSegmentSize}},
      {"local_buffer_size", {"local_buffer_size", SetLocalBufferSize}},
      {"protocol", {"protocol", SetProtocol}},
      {"device_name", {"device_name", SetDeviceName}},
      {"rdma_devices", {"device_name", SetDeviceName}},
      {"metadata_server", {"metadata_server", SetMetadataServer}},
      {"local_hostname", {"local_hostname", SetLocalHostname}},
      {"replica_num", {"replica_num", SetReplicaNum}},
  };
  return *keys;
}

// Collects the parse error of the SAX parser without exceptions.
class ErrorCapture : public nlohmann::json_sax<nlohmann::json> {
 public:
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override { return true; }
  bool key(string_t&) override { return true; }
  bool end_object() override { return true; }
  bool start_array(std::size_t) override { return true; }
  bool end_array() override { return true; }
  bool parse_error(std::size_t, const std::string&,
                   const nlohmann::detail::exception& ex) override {
    message = ex.what();
    return false;
  }
  std::string message;
};

}  // namespace

absl::StatusOr<StoreConfig> ParseStoreConfig(const ConfigEntries& entries) {
  StoreConfig config;
  absl::flat_hash_map<std::string, std::string> seen;  // canonical -> key as given
  for (const auto& [key, value] : entries) {
    auto it = Keys().find(key);
    if (it == Keys().end()) {
      std::vector<std::string> known;
      for (const auto& [name, spec] : Keys()) known.push_back(name);
      std::sort(known.begin(), known.end());
      return absl::InvalidArgumentError(absl::StrCat("store config: unknown key \"", key,
                                                     "\" (known keys: ",
                                                     absl::StrJoin(known, ", "), ")"));
    }
    auto [previous, inserted] = seen.try_emplace(it->second.canonical, key);
    if (!inserted) {
      return absl::InvalidArgumentError(absl::StrCat("store config: \"", key, "\" and \"",
                                                     previous->second,
                                                     "\" both set the same thing"));
    }
    if (absl::Status s = it->second.setter(key, value, config); !s.ok()) return s;
  }
  if (config.master_server_address.empty()) {
    return absl::InvalidArgumentError(
        "store config: master_server_address (kvpool-master's host:port) is missing");
  }
  return config;
}

absl::StatusOr<StoreConfig> ParseStoreConfigJson(absl::string_view text) {
  nlohmann::json json = nlohmann::json::parse(text.begin(), text.end(), nullptr,
                                              /*allow_exceptions=*/false);
  if (json.is_discarded()) {
    ErrorCapture capture;
    nlohmann::json::sax_parse(text.begin(), text.end(), &capture);
    return absl::InvalidArgumentError(absl::StrCat("store config is not valid JSON: ",
                                                   capture.message));
  }
  if (!json.is_object()) {
    return absl::InvalidArgumentError("store config must be a JSON object");
  }
  ConfigEntries entries;
  for (auto it = json.begin(); it != json.end(); ++it) {
    const nlohmann::json& v = it.value();
    ConfigValue value;
    if (v.is_null()) {
      value = std::monostate{};
    } else if (v.is_boolean()) {
      value = v.get<bool>();
    } else if (v.is_number_unsigned()) {
      uint64_t u = v.get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) {
        value = static_cast<double>(u);
      } else {
        value = static_cast<int64_t>(u);
      }
    } else if (v.is_number_integer()) {
      value = v.get<int64_t>();
    } else if (v.is_number_float()) {
      value = v.get<double>();
    } else if (v.is_string()) {
      value = v.get<std::string>();
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("store config: ", it.key(), " must be a string, number or bool, not ",
                       v.type_name()));
    }
    entries.emplace_back(it.key(), std::move(value));
  }
  return ParseStoreConfig(entries);
}

absl::StatusOr<StoreConfig> LoadStoreConfigFile(const std::string& path) {
  std::ifstream file(path);
  if (!file) return absl::NotFoundError(absl::StrCat("cannot read store config file ", path));
  std::stringstream text;
  text << file.rdbuf();
  absl::StatusOr<StoreConfig> config = ParseStoreConfigJson(text.str());
  if (!config.ok()) {
    return absl::Status(config.status().code(),
                        absl::StrCat(path, ": ", config.status().message()));
  }
  return config;
}

absl::StatusOr<StoreConfig> LoadStoreConfigFromEnv() {
  const char* path = std::getenv("MOONCAKE_CONFIG_PATH");
  if (path == nullptr || *path == '\0') {
    return absl::NotFoundError("the environment variable MOONCAKE_CONFIG_PATH is not set");
  }
  return LoadStoreConfigFile(path);
}

}  // namespace kvpool::engine
