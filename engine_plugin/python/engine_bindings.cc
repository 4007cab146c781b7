#include "engine_plugin/python/engine_bindings.h"

#include <pybind11/stl.h>

#include "absl/strings/str_cat.h"
#include "engine_plugin/kv_cache_layout.h"
#include "engine_plugin/python/gpu_bindings.h"
#include "engine_plugin/python/py_ready_event.h"
#include "engine_plugin/python/store_bindings.h"
#include "engine_plugin/store_worker.h"
#include "engine_plugin/token_database.h"

namespace py = pybind11;

namespace kvpool::engine::python {
namespace {

void ThrowIfError(const absl::Status& status) {
  if (status.ok()) return;
  std::string message(status.message());
  if (absl::IsInvalidArgument(status)) throw py::value_error(message);
  throw std::runtime_error(status.ToString());
}

template <typename T>
T ValueOrThrow(absl::StatusOr<T> value) {
  ThrowIfError(value.status());
  return *std::move(value);
}

// A torch tensor's description: its pointer, its storage's extent, shape and strides.
TensorDesc DescribeTensor(py::handle tensor, std::string name) {
  TensorDesc desc;
  desc.name = std::move(name);
  desc.data_ptr = tensor.attr("data_ptr")().cast<uint64_t>();
  // untyped_storage() from torch 2.0; storage() (a TypedStorage) before it.
  py::object storage = py::hasattr(tensor, "untyped_storage") ? tensor.attr("untyped_storage")()
                                                              : tensor.attr("storage")();
  desc.storage_ptr = storage.attr("data_ptr")().cast<uint64_t>();
  desc.storage_bytes = storage.attr("nbytes")().cast<uint64_t>();
  for (py::handle d : tensor.attr("shape")) desc.shape.push_back(d.cast<int64_t>());
  desc.strides = tensor.attr("stride")().cast<std::vector<int64_t>>();
  desc.element_size = tensor.attr("element_size")().cast<uint32_t>();
  return desc;
}

// "cpu", "cuda", ... of a torch tensor; "cpu" for a TensorDesc (plain numbers: host memory).
std::string DeviceType(py::handle tensor) {
  if (!py::hasattr(tensor, "device")) return "cpu";
  return py::str(tensor.attr("device").attr("type")).cast<std::string>();
}

TensorDesc ToTensorDesc(py::handle obj, std::string name) {
  if (py::isinstance<TensorDesc>(obj)) {
    TensorDesc desc = obj.cast<TensorDesc>();
    if (desc.name.empty()) desc.name = std::move(name);
    return desc;
  }
  if (!py::hasattr(obj, "data_ptr") || !py::hasattr(obj, "stride")) {
    throw py::type_error("expected a torch.Tensor or a kvpool.TensorDesc");
  }
  return DescribeTensor(obj, std::move(name));
}


// A block hash as key text: str as is, bytes (vLLM's BlockHash) in hex, else obj.hex().
std::string HashText(py::handle hash) {
  if (py::isinstance<py::str>(hash)) return hash.cast<std::string>();
  if (py::isinstance<py::bytes>(hash)) return HexHash(hash.cast<std::string>());
  if (py::hasattr(hash, "hex")) return hash.attr("hex")().cast<std::string>();
  throw py::type_error("block hashes must be bytes or str");
}

std::vector<std::string> HashTexts(py::handle hashes) {
  std::vector<std::string> out;
  for (py::handle h : hashes) out.push_back(HashText(h));
  return out;
}

template <typename Set>
py::set ToPySet(const Set& values) {
  py::set out;
  for (const auto& v : values) out.add(py::cast(v));
  return out;
}

// The Python object behind kvpool.StoreWorker.
struct PyStoreWorker {
  std::shared_ptr<Store> store;
  std::unique_ptr<StoreWorker> worker;
  std::vector<py::object> tensors;  // registered tensors, kept alive while the worker runs

  ~PyStoreWorker() {
    if (worker != nullptr) {
      py::gil_scoped_release release;  // the threads may need the GIL to finish
      worker->Stop();
    }
  }

  StoreWorker& Get() {
    if (worker == nullptr) throw std::runtime_error("the StoreWorker is closed");
    return *worker;
  }
};

void Register(PyStoreWorker& self, py::handle tensors, uint64_t num_blocks, bool cross_layer) {
  std::vector<py::object> objects;
  std::vector<TensorDesc> descs = ToTensorDescs(tensors, &objects);
  if (cross_layer && descs.size() != 1) {
    throw py::value_error("a cross-layer KV cache is a single tensor");
  }
  // Every tensor on the CPU, or every one on the same CUDA device.
  std::string kind;
  int device = -1;
  for (size_t i = 0; i < objects.size(); ++i) {
    std::string type = DeviceType(objects[i]);
    if (type != "cpu" && type != "cuda") {
      std::string name = descs[i].name.empty() ? absl::StrCat("#", i) : descs[i].name;
      throw py::value_error(absl::StrCat("KV cache tensor ", name, " is on a ", type,
                                         " device; kvpool takes CPU or CUDA tensors"));
    }
    int index = type == "cuda" ? objects[i].attr("device").attr("index").cast<int>() : -1;
    if (kind.empty()) {
      kind = type;
      device = index;
    } else if (type != kind) {
      throw py::value_error(
          "KV cache tensors are on both the CPU and a CUDA device: register the caches of "
          "one device (all host memory, or all on one GPU)");
    } else if (index != device) {
      throw py::value_error(absl::StrCat("KV cache tensors are on cuda:", device, " and cuda:",
                                         index, ": register one GPU's caches per StoreWorker"));
    }
  }
  absl::Status status;
  if (kind == "cuda") {
    StoreWorker::TransferFactory factory = GpuTransferFactory(self.store, device);
    if (!factory) {
      throw py::value_error(
          "KV cache tensors are on a CUDA device, but this kvpool module was built without "
          "CUDA (no nvcc where it was built)");
    }
    py::gil_scoped_release release;
    status = self.Get().RegisterDeviceKvCaches(descs, num_blocks, factory);
  } else {
    py::gil_scoped_release release;
    status = self.Get().RegisterKvCaches(descs, num_blocks);
  }
  ThrowIfError(status);
  self.tensors = std::move(objects);
}

py::dict SenderStats(const KvSenderStats& s) {
  py::dict d;
  d["requests"] = s.requests;
  d["skipped_for_pressure"] = s.skipped_for_pressure;
  d["keys_checked"] = s.keys_checked;
  d["keys_present"] = s.keys_present;
  d["batches"] = s.batches;
  d["keys_stored"] = s.keys_stored;
  d["bytes_stored"] = s.bytes_stored;
  d["keys_no_space"] = s.keys_no_space;
  d["keys_failed"] = s.keys_failed;
  return d;
}

py::dict ReceiverStats(const KvReceiverStats& s) {
  py::dict d;
  d["requests"] = s.requests;
  d["batches"] = s.batches;
  d["keys_loaded"] = s.keys_loaded;
  d["bytes_loaded"] = s.bytes_loaded;
  d["keys_failed"] = s.keys_failed;
  return d;
}

}  // namespace

std::vector<TensorDesc> ToTensorDescs(py::handle tensors, std::vector<py::object>* objects) {
  std::vector<TensorDesc> descs;
  auto add = [&](py::handle obj, std::string name) {
    descs.push_back(ToTensorDesc(obj, std::move(name)));
    if (objects != nullptr) objects->push_back(py::reinterpret_borrow<py::object>(obj));
  };
  if (py::isinstance<py::dict>(tensors)) {
    for (auto [key, value] : tensors.cast<py::dict>()) add(value, py::str(key));
  } else if (py::isinstance<TensorDesc>(tensors) || py::hasattr(tensors, "data_ptr")) {
    add(tensors, "");
  } else {
    for (py::handle value : tensors) add(value, "");
  }
  return descs;
}

void BindEngine(py::module_& m) {
  // --- Layout ---
  py::class_<TensorDesc>(m, "TensorDesc",
                         "A KV cache tensor as plain numbers: data_ptr, storage_ptr, "
                         "storage_bytes, shape, strides (in elements), element_size, name.")
      .def(py::init([](uint64_t data_ptr, uint64_t storage_ptr, uint64_t storage_bytes,
                       std::vector<int64_t> shape, std::vector<int64_t> strides,
                       uint32_t element_size, std::string name) {
             return TensorDesc{data_ptr, storage_ptr, storage_bytes, std::move(shape),
                               std::move(strides), element_size, std::move(name)};
           }),
           py::arg("data_ptr"), py::arg("storage_ptr"), py::arg("storage_bytes"),
           py::arg("shape"), py::arg("strides"), py::arg("element_size"), py::arg("name") = "")
      .def_static(
          "from_tensor", [](py::handle t, std::string name) { return DescribeTensor(t, name); },
          py::arg("tensor"), py::arg("name") = "")
      .def_readwrite("data_ptr", &TensorDesc::data_ptr)
      .def_readwrite("storage_ptr", &TensorDesc::storage_ptr)
      .def_readwrite("storage_bytes", &TensorDesc::storage_bytes)
      .def_readwrite("shape", &TensorDesc::shape)
      .def_readwrite("strides", &TensorDesc::strides)
      .def_readwrite("element_size", &TensorDesc::element_size)
      .def_readwrite("name", &TensorDesc::name);

  py::class_<KvSegment>(m, "KvSegment")
      .def_readonly("base", &KvSegment::base)
      .def_readonly("block_bytes", &KvSegment::block_bytes)
      .def("__repr__", [](const KvSegment& s) {
        return absl::StrCat("KvSegment(base=0x", absl::Hex(s.base), ", block_bytes=",
                            s.block_bytes, ")");
      });
  py::class_<MemoryRegion>(m, "MemoryRegion")
      .def_readonly("base", &MemoryRegion::base)
      .def_readonly("bytes", &MemoryRegion::bytes);

  py::class_<KvCacheLayout>(m, "KvCacheLayout",
                            "Segments (base address, bytes per block) of a registered KV cache.")
      .def_property_readonly("num_blocks", &KvCacheLayout::num_blocks)
      .def_property_readonly("block_size_tokens", &KvCacheLayout::block_size_tokens)
      .def_property_readonly("segments", &KvCacheLayout::segments)
      .def_property_readonly("regions", &KvCacheLayout::regions)
      .def_property_readonly("bytes_per_block", &KvCacheLayout::bytes_per_block)
      .def_property_readonly("kv_caches_base_addr",
                             [](const KvCacheLayout& l) {
                               std::vector<uint64_t> out;
                               for (const KvSegment& s : l.segments()) out.push_back(s.base);
                               return out;
                             })
      .def_property_readonly("block_len",
                             [](const KvCacheLayout& l) {
                               std::vector<uint64_t> out;
                               for (const KvSegment& s : l.segments()) out.push_back(s.block_bytes);
                               return out;
                             })
      .def("__repr__", &KvCacheLayout::DebugString);

  m.def(
      "describe_tensor", [](py::handle t, std::string name) { return DescribeTensor(t, name); },
      py::arg("tensor"), py::arg("name") = "", "The TensorDesc of a torch tensor.");
  m.def(
      "detect_layout",
      [](py::handle tensors, uint64_t num_blocks, uint32_t block_size) {
        return ValueOrThrow(
            KvCacheLayout::Detect(ToTensorDescs(tensors, nullptr), num_blocks, block_size));
      },
      py::arg("tensors"), py::arg("num_blocks"), py::arg("block_size"),
      "Detects the KV cache layout of a dict {layer: tensor}, a list of tensors or "
      "TensorDescs, or one (cross-layer) tensor. ValueError says why a layout is refused.");

  // --- Keys and addresses ---
  py::class_<KeyMetadata>(m, "KeyMetadata")
      .def(py::init([](std::string model, int tp, int pcp, int dcp, int pp) {
             return KeyMetadata{std::move(model), tp, pcp, dcp, pp};
           }),
           py::arg("model_name"), py::arg("tp_rank") = 0, py::arg("pcp_rank") = 0,
           py::arg("dcp_rank") = 0, py::arg("pp_rank") = 0)
      .def_readwrite("model_name", &KeyMetadata::model_name)
      .def_readwrite("tp_rank", &KeyMetadata::tp_rank)
      .def_readwrite("pcp_rank", &KeyMetadata::pcp_rank)
      .def_readwrite("dcp_rank", &KeyMetadata::dcp_rank)
      .def_readwrite("pp_rank", &KeyMetadata::pp_rank);
  m.def(
      "pool_key",
      [](const KeyMetadata& metadata, py::handle hash) { return PoolKey(metadata, HashText(hash)); },
      py::arg("metadata"), py::arg("chunk_hash"),
      "\"<model>@tp_rank:N@pcpN@dcpN@pp_rank:N@<hash>\"; bytes hashes in hex.");
  m.def(
      "hex_hash", [](const py::bytes& b) { return HexHash(std::string(b)); }, py::arg("hash"));
  m.def(
      "model_key_name", [](const std::string& model) { return ModelKeyName(model); },
      py::arg("model"), "The last path component of a model name or path, as keys use it.");

  py::class_<TokenDatabase>(m, "TokenDatabase")
      .def(py::init<KeyMetadata, uint32_t>(), py::arg("metadata"), py::arg("block_size"))
      .def(
          "set_layout",
          [](TokenDatabase& db, const KvCacheLayout& layout) { ThrowIfError(db.SetLayout(layout)); },
          py::arg("layout"))
      .def_property_readonly("block_size", &TokenDatabase::block_size)
      .def_property_readonly("metadata", &TokenDatabase::metadata)
      .def(
          "key", [](const TokenDatabase& db, py::handle hash) { return db.KeyFor(HashText(hash)); },
          py::arg("chunk_hash"))
      .def(
          "process_tokens",
          [](const TokenDatabase& db, uint64_t token_len, py::handle hashes, uint64_t mask_num) {
            py::list out;
            for (const TokenChunk& c : db.ProcessTokens(token_len, HashTexts(hashes), mask_num)) {
              out.append(py::make_tuple(c.start, c.end, c.key));
            }
            return out;
          },
          py::arg("token_len"), py::arg("block_hashes"), py::arg("mask_num") = 0,
          "[(start, end, key)] for the chunks of the first token_len tokens past mask_num.")
      .def(
          "prepare_value",
          [](const TokenDatabase& db, uint64_t start, uint64_t end, std::vector<int64_t> ids) {
            ChunkBuffers b = ValueOrThrow(db.PrepareValue(start, end, ids));
            return py::make_tuple(b.addrs, b.sizes, b.block_id);
          },
          py::arg("start"), py::arg("end"), py::arg("block_ids"),
          "(addrs, sizes, block_id): the bytes of tokens [start, end) in every segment.")
      .def_static(
          "plan_save",
          [](uint64_t token_len, uint64_t saved, uint32_t block_size, bool discard) {
            SavePlan p = TokenDatabase::PlanSave(token_len, saved, block_size, discard);
            return py::make_tuple(p.save, p.tokens_to_save);
          },
          py::arg("token_len"), py::arg("num_saved_tokens"), py::arg("block_size"),
          py::arg("discard_partial_chunks") = true,
          "(save, tokens_to_save) for a request with token_len computed tokens.");

  // --- Requests ---
  py::class_<LoadSpec>(m, "LoadSpec")
      .def(py::init([](uint64_t vllm_cached, uint64_t kvpool_cached, bool can_load,
                       uint64_t token_len) {
             return LoadSpec{vllm_cached, kvpool_cached, can_load, token_len};
           }),
           py::arg("vllm_cached_tokens"), py::arg("kvpool_cached_tokens"),
           py::arg("can_load") = true, py::arg("token_len") = 0)
      .def_readwrite("vllm_cached_tokens", &LoadSpec::vllm_cached_tokens)
      .def_readwrite("kvpool_cached_tokens", &LoadSpec::kvpool_cached_tokens)
      .def_readwrite("can_load", &LoadSpec::can_load)
      .def_readwrite("token_len", &LoadSpec::token_len);

  py::class_<ReqMeta>(m, "ReqMeta")
      .def(py::init([](std::string req_id, uint64_t token_len_chunk, std::vector<int64_t> block_ids,
                       py::handle block_hashes, bool can_save, std::optional<LoadSpec> load_spec,
                       bool is_last_chunk, py::object ready_event) {
             ReqMeta r;
             r.req_id = std::move(req_id);
             r.token_len_chunk = token_len_chunk;
             r.block_ids = std::move(block_ids);
             r.block_hashes = HashTexts(block_hashes);
             r.can_save = can_save;
             r.load_spec = load_spec;
             r.is_last_chunk = is_last_chunk;
             if (!ready_event.is_none()) {
               r.ready_event = std::make_shared<PyReadyEvent>(std::move(ready_event));
             }
             return r;
           }),
           py::arg("req_id"), py::arg("token_len_chunk"), py::arg("block_ids"),
           py::arg("block_hashes"), py::arg("can_save") = false, py::arg("load_spec") = py::none(),
           py::arg("is_last_chunk") = false, py::arg("ready_event") = py::none())
      .def_readwrite("req_id", &ReqMeta::req_id)
      .def_readwrite("token_len_chunk", &ReqMeta::token_len_chunk)
      .def_readwrite("block_ids", &ReqMeta::block_ids)
      .def_property(
          "block_hashes", [](const ReqMeta& r) { return r.block_hashes; },
          [](ReqMeta& r, py::handle hashes) { r.block_hashes = HashTexts(hashes); })
      .def_readwrite("can_save", &ReqMeta::can_save)
      .def_readwrite("load_spec", &ReqMeta::load_spec)
      .def_readwrite("is_last_chunk", &ReqMeta::is_last_chunk);

  // --- Worker ---
  py::class_<PyStoreWorker>(m, "StoreWorker", R"doc(
The worker side of a KV connector over the pool (vLLM MooncakeStoreConnector's
MooncakeStoreWorker): register the KV caches, then once per scheduler step call
get_finished(finished_req_ids, requests, preempted_req_ids, ready_event) to issue loads and
stores and collect what completed; lookup() tells how many prefix tokens every TP/PP rank's
keys cover in the pool.
)doc")
      .def(py::init([](PyStore& store, std::string model_name, int tp_rank, int tp_size,
                       int pp_rank, int pp_size, int pcp_rank, int pcp_size, int dcp_rank,
                       int dcp_size, int num_kv_heads, bool use_mla, uint32_t block_size,
                       const std::string& kv_role) {
             if (store.store == nullptr) throw std::runtime_error("the store is not set up");
             StoreWorkerOptions options{.model_name = std::move(model_name),
                                        .tp_rank = tp_rank,
                                        .tp_size = tp_size,
                                        .pp_rank = pp_rank,
                                        .pp_size = pp_size,
                                        .pcp_rank = pcp_rank,
                                        .pcp_size = pcp_size,
                                        .dcp_rank = dcp_rank,
                                        .dcp_size = dcp_size,
                                        .num_kv_heads = num_kv_heads,
                                        .use_mla = use_mla,
                                        .block_size = block_size,
                                        .kv_role = ValueOrThrow(ParseKvRole(kv_role))};
             auto self = std::make_unique<PyStoreWorker>();
             self->store = store.store;
             self->worker = ValueOrThrow(StoreWorker::Create(*self->store, std::move(options)));
             return self;
           }),
           py::arg("store"), py::arg("model_name"), py::arg("tp_rank") = 0,
           py::arg("tp_size") = 1, py::arg("pp_rank") = 0, py::arg("pp_size") = 1,
           py::arg("pcp_rank") = 0, py::arg("pcp_size") = 1, py::arg("dcp_rank") = 0,
           py::arg("dcp_size") = 1, py::arg("num_kv_heads") = 1, py::arg("use_mla") = false,
           py::arg("block_size") = 16, py::arg("kv_role") = "kv_both")
      .def(
          "register_kv_caches",
          [](PyStoreWorker& self, py::handle tensors, uint64_t num_blocks) {
            Register(self, tensors, num_blocks, /*cross_layer=*/false);
          },
          py::arg("kv_caches"), py::arg("num_blocks"),
          "Registers {layer: tensor} (or a list) of KV cache tensors, all in host memory or all on "
          "one CUDA device, and starts the threads. CUDA caches move through the GPU copy "
          "kernels (same-host pools in one copy, others through pinned staging).")
      .def(
          "register_cross_layers_kv_caches",
          [](PyStoreWorker& self, py::handle tensor, uint64_t num_blocks) {
            Register(self, tensor, num_blocks, /*cross_layer=*/true);
          },
          py::arg("kv_cache"), py::arg("num_blocks"))
      .def(
          "get_finished",
          [](PyStoreWorker& self, py::iterable finished_req_ids, std::vector<ReqMeta> requests,
             py::iterable preempted_req_ids, py::object ready_event) {
            absl::flat_hash_set<std::string> finished;
            for (py::handle id : finished_req_ids) finished.insert(id.cast<std::string>());
            StepMetadata meta;
            meta.requests = std::move(requests);
            for (py::handle id : preempted_req_ids) {
              meta.preempted_req_ids.insert(id.cast<std::string>());
            }
            if (!ready_event.is_none()) {
              meta.store_ready = std::make_shared<PyReadyEvent>(std::move(ready_event));
            }
            absl::StatusOr<StoreWorker::Finished> done;
            {
              py::gil_scoped_release release;
              done = self.Get().GetFinished(finished, std::move(meta));
            }
            ThrowIfError(done.status());
            return py::make_tuple(ToPySet(done->sending), ToPySet(done->recving));
          },
          py::arg("finished_req_ids"), py::arg("requests"),
          py::arg("preempted_req_ids") = py::tuple(), py::arg("ready_event") = py::none(),
          "Issues the step's loads and stores; returns (done_sending, done_recving). "
          "ready_event (e.g. a recorded torch.cuda.Event) is waited for before stored blocks "
          "are read.")
      .def(
          "start_load_kv",
          [](PyStoreWorker& self, std::vector<ReqMeta> requests) {
            StepMetadata meta;
            meta.requests = std::move(requests);
            py::gil_scoped_release release;
            ThrowIfError(self.Get().StartLoadKv(meta));
          },
          py::arg("requests"),
          "vLLM's start_load_kv: starts the loads of these requests now, layer by layer (layer "
          "0 of every block first), so the step computes layer i while later layers arrive. The "
          "next get_finished does not load them again; it reports them (done_recving, and "
          "take_failed_load_block_ids, checksums included): an engine must not keep what it "
          "computed from a failed block.")
      .def(
          "wait_for_layer_load",
          [](PyStoreWorker& self, int layer, uintptr_t stream) {
            ThrowIfError(self.Get().WaitForLayerLoad(layer, stream));
          },
          py::arg("layer"), py::arg("stream"),
          "vLLM's wait_for_layer_load: makes `stream` (torch.cuda.current_stream().cuda_stream) "
          "wait on the GPU until layer `layer` (the registered tensors' order) of the loads "
          "start_load_kv started has landed. Does not block; works inside a CUDA graph capture "
          "(each replay then waits for the load started before it).")
      .def(
          "lookup",
          [](PyStoreWorker& self, uint64_t token_len, py::handle hashes) {
            std::vector<std::string> texts = HashTexts(hashes);
            StoreWorker& worker = self.Get();
            py::gil_scoped_release release;
            return worker.Lookup(token_len, texts);
          },
          py::arg("token_len"), py::arg("block_hashes"))
      .def("take_failed_load_block_ids",
           [](PyStoreWorker& self) { return ToPySet(self.Get().TakeFailedLoadBlockIds()); })
      .def("wait_idle",
           [](PyStoreWorker& self) {
             StoreWorker& worker = self.Get();
             py::gil_scoped_release release;
             worker.WaitIdle();
           })
      .def("close",
           [](PyStoreWorker& self) {
             std::unique_ptr<StoreWorker> worker = std::move(self.worker);
             if (worker != nullptr) {
               py::gil_scoped_release release;
               worker->Stop();
               worker.reset();
             }
             self.tensors.clear();
           })
      .def_property_readonly("block_size", [](PyStoreWorker& self) { return self.Get().block_size(); })
      .def_property_readonly("put_step", [](PyStoreWorker& self) { return self.Get().put_step(); })
      .def_property_readonly("key_metadata",
                             [](PyStoreWorker& self) { return self.Get().key_metadata(); })
      .def_property_readonly("token_database",
                             [](PyStoreWorker& self) { return self.Get().token_database(); })
      .def_property_readonly("layout",
                             [](PyStoreWorker& self) -> py::object {
                               const std::optional<KvCacheLayout>& l = self.Get().layout();
                               return l.has_value() ? py::cast(*l) : py::none();
                             })
      .def_property_readonly("on_gpu",
                             [](PyStoreWorker& self) { return self.Get().has_transfer(); })
      .def_property_readonly("store_pressure_active",
                             [](PyStoreWorker& self) {
                               const KvSender* s = self.Get().sender();
                               return s != nullptr && s->store_pressure_active();
                             })
      .def("sender_stats",
           [](PyStoreWorker& self) -> py::object {
             const KvSender* s = self.Get().sender();
             return s == nullptr ? py::none() : py::object(SenderStats(s->stats()));
           })
      .def("receiver_stats", [](PyStoreWorker& self) -> py::object {
        const KvReceiver* r = self.Get().receiver();
        return r == nullptr ? py::none() : py::object(ReceiverStats(r->stats()));
      });
}

}  // namespace kvpool::engine::python
