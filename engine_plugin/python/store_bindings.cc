#include "engine_plugin/python/store_bindings.h"

#include <pybind11/stl.h>

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "kvpool/v1/common.pb.h"
#include "proto/channel.h"
#include "proto/tls.h"

namespace py = pybind11;

namespace kvpool::engine::python {
namespace {

constexpr int kInvalidParams = v1::INVALID_PARAMS;

absl::Status NotSetUp() {
  return absl::FailedPreconditionError("the store is not set up (call setup() first)");
}

// A Python config value as a ConfigValue; ValueError for lists, dicts, objects.
ConfigValue ToConfigValue(const std::string& key, py::handle value) {
  if (value.is_none()) return std::monostate{};
  if (py::isinstance<py::bool_>(value)) return value.cast<bool>();
  if (py::isinstance<py::int_>(value)) return value.cast<int64_t>();
  if (py::isinstance<py::float_>(value)) return value.cast<double>();
  if (py::isinstance<py::str>(value)) return value.cast<std::string>();
  if (py::isinstance<py::bytes>(value)) return value.cast<std::string>();
  throw py::value_error(absl::StrCat("store config: ", key, " must be a string, number or bool"));
}

std::string Environment(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? "" : value;
}

// Credentials from the environment (the Python API has no place for them), as kvpoolctl and
// kvpool-bench read them: KVPOOL_TLS_CA, KVPOOL_TLS_CERT, KVPOOL_TLS_KEY,
// KVPOOL_TLS_SERVER_NAME, KVPOOL_DATA_TLS=1 (TLS on the TCP data plane too), and token files
// KVPOOL_AUTH_TOKEN_FILE (the engine's) and KVPOOL_SEGMENT_AUTH_TOKEN_FILE (its in-process
// segment's).
absl::Status CredentialsFromEnvironment(ClientOptions& options, std::string& segment_token) {
  options.tls_ca_file = Environment("KVPOOL_TLS_CA");
  options.tls_cert_file = Environment("KVPOOL_TLS_CERT");
  options.tls_key_file = Environment("KVPOOL_TLS_KEY");
  options.tls_server_name = Environment("KVPOOL_TLS_SERVER_NAME");
  options.data_tls = DataTlsFromEnvironment();
  for (auto [variable, token] : {std::pair{"KVPOOL_AUTH_TOKEN_FILE", &options.auth_token},
                                 std::pair{"KVPOOL_SEGMENT_AUTH_TOKEN_FILE", &segment_token}}) {
    if (std::string path = Environment(variable); !path.empty()) {
      absl::StatusOr<std::string> read = ReadTokenFile(path);
      if (!read.ok()) return absl::InvalidArgumentError(absl::StrCat(variable, ": ", read.status().message()));
      *token = *std::move(read);
    }
  }
  return absl::OkStatus();
}

// Opens the store from a parsed config (closing any earlier one); logs the reason and returns
// the Mooncake-style code on failure, 0 on success.
int Open(PyStore& self, const absl::StatusOr<StoreConfig>& config, const char* method) {
  if (!config.ok()) {
    KVPOOL_LOG(ERROR) << "kvpool.Store." << method << ": " << config.status().message();
    return kInvalidParams;
  }
  ClientOptions credentials;
  std::string segment_token;
  if (absl::Status env = CredentialsFromEnvironment(credentials, segment_token); !env.ok()) {
    KVPOOL_LOG(ERROR) << "kvpool.Store." << method << ": " << env.message();
    return kInvalidParams;
  }
  absl::StatusOr<std::unique_ptr<Store>> store;
  {
    py::gil_scoped_release release;
    store = Store::Open(*config, credentials, segment_token);
  }
  if (!store.ok()) {
    KVPOOL_LOG(ERROR) << "kvpool.Store." << method << ": " << store.status().ToString();
    return ToErrorCode(store.status());
  }
  if (self.store != nullptr) {
    std::shared_ptr<Store> old = std::move(self.store);
    py::gil_scoped_release release;
    old->Close();
  }
  self.store = std::shared_ptr<Store>(std::move(*store));
  return 0;
}

int SetupFromDict(PyStore& self, const py::dict& config) {
  ConfigEntries entries;
  for (auto [key, value] : config) {
    std::string name = py::str(key);
    entries.emplace_back(name, ToConfigValue(name, value));
  }
  return Open(self, ParseStoreConfig(entries), "setup");
}

int SetupPositional(PyStore& self, const std::string& local_hostname,
                    const std::string& metadata_server, py::object global_segment_size,
                    py::object local_buffer_size, const std::string& protocol,
                    const std::string& rdma_devices, const std::string& master_server_addr,
                    py::object engine) {
  if (!engine.is_none()) {
    KVPOOL_LOG(WARNING) << "kvpool.Store.setup: the engine argument (a Mooncake TransferEngine) "
                           "is ignored";
  }
  ConfigEntries entries = {
      {"local_hostname", local_hostname},
      {"metadata_server", metadata_server},
      {"global_segment_size", ToConfigValue("global_segment_size", global_segment_size)},
      {"local_buffer_size", ToConfigValue("local_buffer_size", local_buffer_size)},
      {"protocol", protocol},
      {"rdma_devices", rdma_devices},
      {"master_server_addr", master_server_addr},
  };
  return Open(self, ParseStoreConfig(entries), "setup");
}

int SetupFromFile(PyStore& self, std::optional<std::string> path) {
  return Open(self, path.has_value() ? LoadStoreConfigFile(*path) : LoadStoreConfigFromEnv(),
              "setup_from_file");
}

// Per-key multi-buffer items from Python lists; nullopt (and a log line) if the lists do not
// line up.
template <typename Item, typename Buffer>
std::optional<std::vector<Item>> Items(const std::vector<std::string>& keys,
                                       const std::vector<std::vector<uintptr_t>>& ptrs,
                                       const std::vector<std::vector<size_t>>& sizes,
                                       const char* method) {
  if (keys.size() != ptrs.size() || keys.size() != sizes.size()) {
    KVPOOL_LOG(ERROR) << method << ": " << keys.size() << " keys but " << ptrs.size()
                      << " pointer lists and " << sizes.size() << " size lists";
    return std::nullopt;
  }
  std::vector<Item> items(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    if (ptrs[i].size() != sizes[i].size()) {
      KVPOOL_LOG(ERROR) << method << ": key " << keys[i] << " has " << ptrs[i].size()
                        << " pointers but " << sizes[i].size() << " sizes";
      return std::nullopt;
    }
    items[i].key = keys[i];
    for (size_t j = 0; j < ptrs[i].size(); ++j) {
      items[i].parts.push_back(Buffer{reinterpret_cast<decltype(Buffer::data)>(ptrs[i][j]),
                                      sizes[i][j]});
    }
  }
  return items;
}

std::vector<int64_t> BatchPutMulti(PyStore& self, const std::vector<std::string>& keys,
                                   const std::vector<std::vector<uintptr_t>>& ptrs,
                                   const std::vector<std::vector<size_t>>& sizes,
                                   const py::object& /*config*/) {
  std::optional<std::vector<PutItem>> items =
      Items<PutItem, ConstBuffer>(keys, ptrs, sizes, "batch_put_from_multi_buffers");
  if (!items.has_value()) return std::vector<int64_t>(keys.size(), kInvalidParams);
  std::shared_ptr<Store> store = self.store;
  if (store == nullptr) return std::vector<int64_t>(keys.size(), ToErrorCode(NotSetUp()));
  std::vector<absl::Status> results;
  {
    py::gil_scoped_release release;
    results = store->BatchPut(*items);
  }
  std::vector<int64_t> out;
  out.reserve(results.size());
  for (size_t i = 0; i < results.size(); ++i) {
    if (results[i].ok()) {
      int64_t bytes = 0;
      for (const ConstBuffer& part : (*items)[i].parts) bytes += static_cast<int64_t>(part.size);
      out.push_back(bytes);
    } else {
      out.push_back(ToErrorCode(results[i]));
    }
  }
  return out;
}

std::vector<int64_t> BatchGetMulti(PyStore& self, const std::vector<std::string>& keys,
                                   const std::vector<std::vector<uintptr_t>>& ptrs,
                                   const std::vector<std::vector<size_t>>& sizes) {
  std::optional<std::vector<GetItem>> items =
      Items<GetItem, MutableBuffer>(keys, ptrs, sizes, "batch_get_into_multi_buffers");
  if (!items.has_value()) return std::vector<int64_t>(keys.size(), kInvalidParams);
  std::shared_ptr<Store> store = self.store;
  if (store == nullptr) return std::vector<int64_t>(keys.size(), ToErrorCode(NotSetUp()));
  std::vector<absl::StatusOr<uint64_t>> results;
  {
    py::gil_scoped_release release;
    results = store->BatchGet(*items);
  }
  std::vector<int64_t> out;
  out.reserve(results.size());
  for (const absl::StatusOr<uint64_t>& r : results) {
    out.push_back(r.ok() ? static_cast<int64_t>(*r) : ToErrorCode(r.status()));
  }
  return out;
}

// One single-element list per entry (single-buffer calls as multi-buffer ones).
template <typename T>
std::vector<std::vector<T>> Nest(const std::vector<T>& values) {
  std::vector<std::vector<T>> nested;
  for (const T& v : values) nested.push_back({v});
  return nested;
}

std::vector<int> BatchIsExist(PyStore& self, const std::vector<std::string>& keys) {
  std::shared_ptr<Store> store = self.store;
  if (store == nullptr) return std::vector<int>(keys.size(), -1);
  std::vector<absl::StatusOr<bool>> results;
  {
    py::gil_scoped_release release;
    results = store->BatchExist(keys);
  }
  std::vector<int> out;
  for (const absl::StatusOr<bool>& r : results) out.push_back(r.ok() ? (*r ? 1 : 0) : -1);
  return out;
}

// PutOptions from the Python layer's arguments (kvpool.store.ReplicateConfig unpacked):
// pin 0 none, 1 soft, 2 hard.
PutOptions MakePutOptions(uint32_t replicas, int pin, bool prefer_local,
                          std::vector<std::string> preferred_segments = {}) {
  PutOptions options;
  options.replicas = replicas == 0 ? 1 : replicas;
  options.pin = pin == 2 ? PinMode::kHard : pin == 1 ? PinMode::kSoft : PinMode::kNone;
  options.prefer_local_segment = prefer_local;
  options.preferred_segments = std::move(preferred_segments);
  return options;
}

// Stores `items` with per-call options: per key 0 or the negative code (-705 for a key
// stored already, as the client reports it). Parts may be host or device memory.
std::vector<int> PutWithOptions(PyStore& self, const std::vector<PutItem>& items,
                                const PutOptions& options) {
  std::shared_ptr<Store> store = self.store;
  if (store == nullptr) return std::vector<int>(items.size(), ToErrorCode(NotSetUp()));
  std::vector<absl::Status> results;
  {
    py::gil_scoped_release release;
    results = store->BatchPut(items, options);
  }
  std::vector<int> out;
  out.reserve(results.size());
  for (const absl::Status& r : results) out.push_back(ToErrorCode(r));
  return out;
}

// C-contiguous views of Python buffer objects, released on destruction.
class BufferViews {
 public:
  explicit BufferViews(const py::list& values) {
    views_.reserve(values.size());
    for (py::handle value : values) {
      Py_buffer view;
      if (PyObject_GetBuffer(value.ptr(), &view, PyBUF_SIMPLE) != 0) throw py::error_already_set();
      views_.push_back(view);
    }
  }
  ~BufferViews() {
    for (Py_buffer& view : views_) PyBuffer_Release(&view);
  }
  BufferViews(const BufferViews&) = delete;
  BufferViews& operator=(const BufferViews&) = delete;
  const Py_buffer& operator[](size_t i) const { return views_[i]; }

 private:
  std::vector<Py_buffer> views_;
};

// Runs `call` on the store without the GIL; the code of NotSetUp() if there is none.
template <typename F>
auto WithStore(PyStore& self, F call) -> decltype(call(std::declval<Store&>())) {
  std::shared_ptr<Store> store = self.store;
  if (store == nullptr) return NotSetUp();
  py::gil_scoped_release release;
  return call(*store);
}

py::dict StatsDict(const segment::DataServer::Stats& s) {
  py::dict d;
  d["reads"] = s.reads;
  d["writes"] = s.writes;
  d["bytes_read"] = s.bytes_read;
  d["bytes_written"] = s.bytes_written;
  d["rejected"] = s.rejected;
  return d;
}

}  // namespace

void BindStore(py::module_& m) {
  py::class_<PyStore> store(m, "Store", R"doc(
The native handle on a kvpool pool: Mooncake's method names with kvpool's own conventions.
kvpool.store.MooncakeDistributedStore (a subclass) is Mooncake's API with Mooncake's
conventions; engines written for mooncake.store use that one.

Return conventions here: setup/put/put_from/remove/register_buffer/close return 0 or a negative
Mooncake error code; is_exist/batch_is_exist give 1 (present), 0 (absent) or -1 (error);
batch_put_from[_multi_buffers] and batch_get_into[_multi_buffers] give per key the bytes
moved or a negative code (-200 NO_AVAILABLE_HANDLE when the pool is under pressure, -704
OBJECT_NOT_FOUND, -705 OBJECT_ALREADY_EXISTS: the key is stored already, nothing written);
get returns the value or b"" on failure. Failures are logged with their reason.

Buffer addresses (register_buffer, put_from, get_into and their batch and multi-buffer forms)
may be host memory or CUDA device memory, as with Mooncake: device bytes move through pinned
host memory. A device buffer must hold its final bytes when a put is called (synchronize the
stream that wrote it first); a get's device buffers hold theirs when it returns.
)doc");
  store.def(py::init<>())
      .def("setup", &SetupFromDict, py::arg("config"),
           "setup(config: dict) -> int. Keys: master_server_address (or master_server_addr), "
           "global_segment_size, local_buffer_size, protocol, device_name (or rdma_devices), "
           "metadata_server, local_hostname, replica_num. global_segment_size > 0 mounts a "
           "segment of that size inside this process.")
      .def("setup", &SetupPositional, py::arg("local_hostname"), py::arg("metadata_server"),
           py::arg("global_segment_size") = py::int_(16 << 20),
           py::arg("local_buffer_size") = py::int_(16 << 20), py::arg("protocol") = "tcp",
           py::arg("rdma_devices") = "", py::arg("master_server_addr") = "127.0.0.1:50051",
           py::arg("engine") = py::none(), "Mooncake's positional setup.")
      .def("setup_from_file", &SetupFromFile, py::arg("path") = py::none(),
           "Sets up from a Mooncake JSON config file (default: $MOONCAKE_CONFIG_PATH).")
      .def(
          "register_buffer",
          [](PyStore& self, uintptr_t ptr, size_t size) {
            return ToErrorCode(WithStore(self, [&](Store& s) { return s.RegisterBuffer(ptr, size); }));
          },
          py::arg("buffer_ptr"), py::arg("size"))
      .def(
          "unregister_buffer",
          [](PyStore& self, uintptr_t ptr) {
            return ToErrorCode(WithStore(self, [&](Store& s) { return s.UnregisterBuffer(ptr); }));
          },
          py::arg("buffer_ptr"))
      .def("batch_is_exist", &BatchIsExist, py::arg("keys"),
           "1 if the key exists, 0 if not, -1 on error, per key.")
      .def(
          "is_exist",
          [](PyStore& self, const std::string& key) { return BatchIsExist(self, {key})[0]; },
          py::arg("key"))
      .def("batch_put_from_multi_buffers", &BatchPutMulti, py::arg("keys"),
           py::arg("all_buffer_ptrs"), py::arg("all_sizes"), py::arg("config") = py::none(),
           "Stores each key's value gathered from its buffers; per key the bytes stored or a "
           "negative code (-200: the pool is under pressure).")
      .def(
          "batch_get_into_multi_buffers",
          [](PyStore& self, const std::vector<std::string>& keys,
             const std::vector<std::vector<uintptr_t>>& ptrs,
             const std::vector<std::vector<size_t>>& sizes,
             bool /*prefer_same_node*/) { return BatchGetMulti(self, keys, ptrs, sizes); },
          py::arg("keys"), py::arg("all_buffer_ptrs"), py::arg("all_sizes"),
          py::arg("prefer_alloc_in_same_node") = false,
          "Reads each key's value scattered over its buffers; per key the bytes read or a "
          "negative code.")
      .def(
          "batch_put_from",
          [](PyStore& self, const std::vector<std::string>& keys,
             const std::vector<uintptr_t>& ptrs, const std::vector<size_t>& sizes,
             const py::object& config) {
            if (keys.size() != ptrs.size() || keys.size() != sizes.size()) {
              return std::vector<int64_t>(keys.size(), kInvalidParams);
            }
            return BatchPutMulti(self, keys, Nest(ptrs), Nest(sizes), config);
          },
          py::arg("keys"), py::arg("buffer_ptrs"), py::arg("sizes"), py::arg("config") = py::none())
      .def(
          "batch_get_into",
          [](PyStore& self, const std::vector<std::string>& keys,
             const std::vector<uintptr_t>& ptrs, const std::vector<size_t>& sizes) {
            if (keys.size() != ptrs.size() || keys.size() != sizes.size()) {
              return std::vector<int64_t>(keys.size(), kInvalidParams);
            }
            return BatchGetMulti(self, keys, Nest(ptrs), Nest(sizes));
          },
          py::arg("keys"), py::arg("buffer_ptrs"), py::arg("sizes"))
      .def(
          "put_from",
          [](PyStore& self, const std::string& key, uintptr_t ptr, size_t size,
             const py::object& config) {
            int64_t r = BatchPutMulti(self, {key}, {{ptr}}, {{size}}, config)[0];
            return r < 0 ? static_cast<int>(r) : 0;
          },
          py::arg("key"), py::arg("buffer_ptr"), py::arg("size"), py::arg("config") = py::none())
      .def(
          "get_into",
          [](PyStore& self, const std::string& key, uintptr_t ptr, size_t size) {
            return BatchGetMulti(self, {key}, {{ptr}}, {{size}})[0];
          },
          py::arg("key"), py::arg("buffer_ptr"), py::arg("size"))
      .def(
          "put",
          [](PyStore& self, const std::string& key, const py::buffer& value,
             const py::object& /*config*/) {
            // A simple (C-contiguous) view: BufferError for strided arrays, whose bytes are
            // not one range.
            Py_buffer view;
            if (PyObject_GetBuffer(value.ptr(), &view, PyBUF_SIMPLE) != 0) {
              throw py::error_already_set();
            }
            absl::string_view bytes(static_cast<const char*>(view.buf),
                                    static_cast<size_t>(view.len));
            int code = ToErrorCode(WithStore(self, [&](Store& s) { return s.Put(key, bytes); }));
            PyBuffer_Release(&view);
            return code;
          },
          py::arg("key"), py::arg("value"), py::arg("config") = py::none())
      .def(
          "get",
          [](PyStore& self, const std::string& key) {
            std::shared_ptr<Store> store = self.store;
            if (store == nullptr) return py::bytes();
            absl::StatusOr<std::string> value;
            {
              py::gil_scoped_release release;
              value = store->Get(key);
            }
            if (!value.ok()) {
              if (!absl::IsNotFound(value.status())) {
                KVPOOL_LOG(WARNING) << "kvpool.Store.get(" << key << "): " << value.status();
              }
              return py::bytes();
            }
            return py::bytes(*value);
          },
          py::arg("key"))
      .def(
          "get_size",
          [](PyStore& self, const std::string& key) -> int64_t {
            std::shared_ptr<Store> store = self.store;
            if (store == nullptr) return ToErrorCode(NotSetUp());
            py::gil_scoped_release release;
            absl::StatusOr<uint64_t> size = store->Size(key);
            return size.ok() ? static_cast<int64_t>(*size) : ToErrorCode(size.status());
          },
          py::arg("key"))
      .def(
          "remove",
          [](PyStore& self, const std::string& key, bool force) {
            return ToErrorCode(WithStore(self, [&](Store& s) { return s.Remove(key, force); }));
          },
          py::arg("key"), py::arg("force") = false)
      .def(
          "remove_all",
          [](PyStore& self, bool force) -> int64_t {
            std::shared_ptr<Store> store = self.store;
            if (store == nullptr) return ToErrorCode(NotSetUp());
            py::gil_scoped_release release;
            absl::StatusOr<uint64_t> removed = store->RemoveAll(force);
            return removed.ok() ? static_cast<int64_t>(*removed) : ToErrorCode(removed.status());
          },
          py::arg("force") = false)
      .def("close",
           [](PyStore& self) {
             std::shared_ptr<Store> store = std::move(self.store);
             if (store != nullptr) {
               py::gil_scoped_release release;
               store->Close();
             }
             return 0;
           })
      .def("get_hostname",
           [](PyStore& self) -> std::string {
             if (self.store == nullptr) return "";
             std::optional<std::string> name = self.store->local_segment_name();
             return name.value_or("");
           })
      // --- primitives of kvpool.store.MooncakeDistributedStore (Mooncake's conventions are
      // applied there): per-call replica count, pin and placement; raw codes per key ---
      .def(
          "_put_parts",
          [](PyStore& self, const std::vector<std::string>& keys,
             const std::vector<std::vector<uintptr_t>>& ptrs,
             const std::vector<std::vector<size_t>>& sizes, uint32_t replicas, int pin,
             bool prefer_local, std::vector<std::string> preferred_segments) {
            std::optional<std::vector<PutItem>> items =
                Items<PutItem, ConstBuffer>(keys, ptrs, sizes, "put");
            if (!items.has_value()) return std::vector<int>(keys.size(), kInvalidParams);
            return PutWithOptions(self, *items,
                                  MakePutOptions(replicas, pin, prefer_local,
                                                 std::move(preferred_segments)));
          },
          py::arg("keys"), py::arg("ptrs"), py::arg("sizes"), py::arg("replicas") = 1,
          py::arg("pin") = 0, py::arg("prefer_local") = false,
          py::arg("preferred_segments") = std::vector<std::string>{})
      .def(
          "_read_bytes",
          [](PyStore& self, uintptr_t ptr, size_t size) -> py::object {
            std::shared_ptr<Store> store = self.store;
            if (store == nullptr) return py::int_(ToErrorCode(NotSetUp()));
            absl::StatusOr<std::string> bytes;
            {
              py::gil_scoped_release release;
              bytes = store->ReadBytes(ptr, size);
            }
            if (!bytes.ok()) {
              KVPOOL_LOG(ERROR) << "read of " << size << " bytes at "
                                << absl::StrCat("0x", absl::Hex(ptr)) << ": " << bytes.status();
              return py::int_(ToErrorCode(bytes.status()));
            }
            return py::bytes(*bytes);
          },
          py::arg("ptr"), py::arg("size"),
          "The bytes at ptr (host or CUDA device memory), or a negative code.")
      .def(
          "_write_bytes",
          [](PyStore& self, uintptr_t ptr, const py::bytes& data) {
            absl::string_view view(PyBytes_AS_STRING(data.ptr()),
                                   static_cast<size_t>(PyBytes_GET_SIZE(data.ptr())));
            absl::Status written =
                WithStore(self, [&](Store& s) { return s.WriteBytes(ptr, view); });
            if (!written.ok()) {
              KVPOOL_LOG(ERROR) << "write of " << view.size() << " bytes at "
                                << absl::StrCat("0x", absl::Hex(ptr)) << ": " << written;
            }
            return ToErrorCode(written);
          },
          py::arg("ptr"), py::arg("data"),
          "Writes data at ptr (host or CUDA device memory): 0 or a negative code.")
      .def(
          "_on_device",
          [](PyStore& self, uintptr_t ptr) {
            std::shared_ptr<Store> store = self.store;
            return store != nullptr && store->OnDevice(ptr);
          },
          py::arg("ptr"), "Whether ptr is CUDA device memory.")
      .def(
          "_put_values",
          [](PyStore& self, const std::vector<std::string>& keys, const py::list& values,
             uint32_t replicas, int pin, bool prefer_local,
             std::vector<std::string> preferred_segments) {
            if (keys.size() != values.size()) {
              return std::vector<int>(keys.size(), kInvalidParams);
            }
            // A value is one bytes-like object, or a tuple of them: its parts, gathered.
            py::list flat;
            std::vector<size_t> first(keys.size() + 1, 0);
            for (size_t i = 0; i < keys.size(); ++i) {
              py::handle value = values[i];
              if (py::isinstance<py::tuple>(value)) {
                for (py::handle part : py::reinterpret_borrow<py::tuple>(value)) flat.append(part);
              } else {
                flat.append(value);
              }
              first[i + 1] = flat.size();
            }
            BufferViews views(flat);
            std::vector<PutItem> items(keys.size());
            for (size_t i = 0; i < keys.size(); ++i) {
              items[i].key = keys[i];
              for (size_t j = first[i]; j < first[i + 1]; ++j) {
                items[i].parts.push_back(
                    ConstBuffer{views[j].buf, static_cast<size_t>(views[j].len)});
              }
            }
            return PutWithOptions(self, items,
                                  MakePutOptions(replicas, pin, prefer_local,
                                                 std::move(preferred_segments)));
          },
          py::arg("keys"), py::arg("values"), py::arg("replicas") = 1, py::arg("pin") = 0,
          py::arg("prefer_local") = false,
          py::arg("preferred_segments") = std::vector<std::string>{},
          "Each value (bytes-like, C-contiguous, or a tuple of such parts, gathered without a "
          "copy) is stored whole; per key 0 or a code.")
      .def(
          "_get_values",
          [](PyStore& self, const std::vector<std::string>& keys) {
            std::shared_ptr<Store> store = self.store;
            py::list out;
            if (store == nullptr) {
              for (size_t i = 0; i < keys.size(); ++i) out.append(ToErrorCode(NotSetUp()));
              return out;
            }
            std::vector<absl::StatusOr<std::string>> values;
            values.reserve(keys.size());
            {
              py::gil_scoped_release release;
              for (const std::string& key : keys) values.push_back(store->Get(key));
            }
            for (const absl::StatusOr<std::string>& v : values) {
              if (v.ok()) {
                out.append(py::bytes(*v));
              } else {
                out.append(ToErrorCode(v.status()));
              }
            }
            return out;
          },
          py::arg("keys"), "Per key the value (bytes) or a negative code.")
      .def(
          "batch_remove",
          [](PyStore& self, const std::vector<std::string>& keys, bool force) {
            std::shared_ptr<Store> store = self.store;
            std::shared_ptr<Client> client = store == nullptr ? nullptr : store->client();
            if (client == nullptr) return std::vector<int>(keys.size(), ToErrorCode(NotSetUp()));
            std::vector<absl::Status> results;
            {
              py::gil_scoped_release release;
              results = client->BatchRemove(keys, force);
            }
            std::vector<int> out;
            for (const absl::Status& r : results) out.push_back(ToErrorCode(r));
            return out;
          },
          py::arg("keys"), py::arg("force") = false,
          "Per key 0 or a negative code (-704 absent, -706 leased and not force).")
      .def(
          "_copy_replica",
          [](PyStore& self, const std::string& key, const std::vector<std::string>& targets,
             const std::string& move_from, bool check_only) -> py::tuple {
            std::shared_ptr<Store> store = self.store;
            std::shared_ptr<Client> client = store == nullptr ? nullptr : store->client();
            absl::Status status = NotSetUp();
            if (client != nullptr) {
              py::gil_scoped_release release;
              status = check_only ? client->CheckCopyReplica(key, targets, move_from)
                                  : client->CopyReplica(key, targets, move_from);
            }
            return py::make_tuple(ToErrorCode(status), std::string(status.message()));
          },
          py::arg("key"), py::arg("targets"), py::arg("move_from") = "",
          py::arg("check_only") = false,
          "Client::CopyReplica (or only its checks): (0 or a negative code, message). Blocks "
          "until the copy or move is made; the GIL is released meanwhile.")
      .def(
          "_drop_replicas",
          [](PyStore& self, const std::vector<std::string>& keys, const std::string& segment,
             bool force) {
            std::shared_ptr<Store> store = self.store;
            std::shared_ptr<Client> client = store == nullptr ? nullptr : store->client();
            if (client == nullptr) return std::vector<int>(keys.size(), ToErrorCode(NotSetUp()));
            std::vector<absl::Status> results;
            {
              py::gil_scoped_release release;
              results = client->BatchDropReplicas(keys, segment, force);
            }
            std::vector<int> out;
            for (const absl::Status& r : results) out.push_back(ToErrorCode(r));
            return out;
          },
          py::arg("keys"), py::arg("segment"), py::arg("force") = false,
          "Per key: its replica on `segment` dropped (the others stay): 0, -704 (no such "
          "object or no replica there), -706 (leased and not force), or another negative code.")
      .def(
          "_remove_by_regex",
          [](PyStore& self, const std::string& pattern, bool force) -> int64_t {
            std::shared_ptr<Store> store = self.store;
            std::shared_ptr<Client> client = store == nullptr ? nullptr : store->client();
            if (client == nullptr) return ToErrorCode(NotSetUp());
            absl::StatusOr<uint64_t> removed;
            {
              py::gil_scoped_release release;
              removed = client->RemoveByRegex(pattern, force);
            }
            if (!removed.ok()) {
              KVPOOL_LOG(ERROR) << "remove_by_regex: " << removed.status();
              return ToErrorCode(removed.status());
            }
            return static_cast<int64_t>(*removed);
          },
          py::arg("pattern"), py::arg("force") = false,
          "How many objects were removed, or a negative code.")
      .def(
          "_replicas",
          [](PyStore& self, const std::vector<std::string>& keys) {
            std::shared_ptr<Store> store = self.store;
            std::shared_ptr<Client> client = store == nullptr ? nullptr : store->client();
            py::list out;
            if (client == nullptr) {
              for (size_t i = 0; i < keys.size(); ++i) out.append(ToErrorCode(NotSetUp()));
              return out;
            }
            std::vector<absl::StatusOr<std::vector<ReplicaLocation>>> located;
            {
              py::gil_scoped_release release;
              located = client->BatchReplicaLocations(keys);
            }
            for (const auto& replicas : located) {
              if (!replicas.ok()) {
                out.append(ToErrorCode(replicas.status()));
                continue;
              }
              py::list list;
              for (const ReplicaLocation& r : *replicas) {
                list.append(py::make_tuple(r.segment_name, r.endpoint, r.offset, r.length));
              }
              out.append(list);
            }
            return out;
          },
          py::arg("keys"),
          "Per key a list of (segment_name, endpoint, offset, length), or a negative code.")
      .def(
          "_ping",
          [](PyStore& self) -> int {
            std::shared_ptr<Store> store = self.store;
            std::shared_ptr<Client> client = store == nullptr ? nullptr : store->client();
            if (client == nullptr) return ToErrorCode(NotSetUp());
            py::gil_scoped_release release;
            return ToErrorCode(client->GetClusterStatus().status());
          },
          "0 if the master answers, else its code.")
      // --- kvpool extras ---
      .def_property_readonly("is_setup", [](PyStore& self) { return self.store != nullptr; })
      .def(
          "segment_stats",
          [](PyStore& self) -> py::object {
            if (self.store == nullptr) return py::none();
            std::optional<segment::DataServer::Stats> stats = self.store->local_segment_stats();
            if (!stats.has_value()) return py::none();
            return StatsDict(*stats);
          },
          "Data-plane counters of the in-process segment (None without one).")
      .def(
          "cluster_status",
          [](PyStore& self) -> py::object {
            std::shared_ptr<Store> store = self.store;
            if (store == nullptr) return py::none();
            absl::StatusOr<ClusterStatus> status;
            {
              py::gil_scoped_release release;
              status = store->GetClusterStatus();
            }
            if (!status.ok()) throw std::runtime_error(status.status().ToString());
            py::dict d;
            d["capacity_bytes"] = status->capacity_bytes;
            d["used_bytes"] = status->used_bytes;
            d["objects"] = status->objects;
            d["pending_objects"] = status->pending_objects;
            d["segments"] = status->segments.size();
            return d;
          },
          "The pool's totals: capacity_bytes, used_bytes, objects, pending_objects, segments.")
      .def("registered_buffers", [](PyStore& self) {
        return self.store == nullptr ? std::vector<std::pair<uint64_t, uint64_t>>{}
                                     : self.store->RegisteredBuffers();
      });
}

}  // namespace kvpool::engine::python
