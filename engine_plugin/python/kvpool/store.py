"""Mooncake Store's Python API over kvpool: `kvpool.store` mirrors `mooncake.store`.

    from kvpool.store import MooncakeDistributedStore, ReplicateConfig   # was: mooncake.store

Same class and method names, signatures, defaults and return conventions as Mooncake's
`mooncake.store.MooncakeDistributedStore` (mooncake-integration/store/store_py.cpp):

- put family (put, put_parts, put_batch, put_from, batch_put_from, batch_put_from_multi_buffers,
  put_from_with_metadata, the tensor puts): 0 on success, and 0 for a key that is stored
  already (nothing is written: objects are immutable); -200 (NO_AVAILABLE_HANDLE) when the pool
  is under pressure; other negative codes as docs/semantics.md lists them.
- upsert family: the key ends up holding the new value (an existing object is replaced).
- get family: get -> bytes (b"" if absent), get_into -> bytes read or a negative code,
  get_buffer -> BufferHandle or None, get_tensor -> tensor or None.
- is_exist / batch_is_exist: 1 present, 0 absent, -1 error.
- remove / batch_remove: 0 or a negative code; remove_all / remove_by_regex: how many removed.

A store that was never set up (or was closed) raises StoreNotSetUpError from every call but
close() (0), health_check() (1) and get_hostname() (""), instead of returning an unrelated code.
Where kvpool has no such subsystem (SSD offload, CXL, NVMe-oF, the transfer engine) the
argument is accepted and a warning says it has no effect. Mooncake's unified parallelism API
(ParallelAxis, TensorParallelism, ReadTarget and the *_tensor_with_parallelism* calls) is in
kvpool._parallel, with Mooncake's keys and object layouts; the put/get session calls in
kvpool._sessions; the copy and move tasks (create_copy_task, create_move_task, query_task) in
kvpool._tasks. docs/engine_plugin.md lists the differences.
"""

import ctypes
import logging
import mmap
import random
import re
import socket
import warnings
from enum import IntEnum

from kvpool import _kvpool
from kvpool import _parallel
from kvpool import _sessions
from kvpool import _tasks
from kvpool import _tensor
from kvpool._parallel import ParallelAxis, ReadTarget, TensorParallelism
from kvpool._tasks import QueryTaskResponse, TaskStatus, TaskType

__all__ = [
    "MooncakeDistributedStore", "ReplicateConfig", "SoftPinAction", "ReplicaStatus",
    "ReplicaDescriptor", "MemoryDescriptor", "DiskDescriptor", "Descriptor", "BufferHandle",
    "MooncakeHostMemAllocator", "ObjectDataType", "TaskType", "TaskStatus", "QueryTaskResponse",
    "ParallelAxis", "TensorParallelism", "ReadTarget", "StoreNotSetUpError", "Store",
]

Store = _kvpool.Store
_log = logging.getLogger("kvpool.store")

# Mooncake's error codes (the ones this module returns itself).
OK = 0
BUFFER_OVERFLOW = -10
NO_AVAILABLE_HANDLE = _kvpool.NO_AVAILABLE_HANDLE
INVALID_PARAMS = _kvpool.INVALID_PARAMS
OBJECT_NOT_FOUND = _kvpool.OBJECT_NOT_FOUND
OBJECT_ALREADY_EXISTS = _kvpool.OBJECT_ALREADY_EXISTS
OBJECT_HAS_LEASE = _kvpool.OBJECT_HAS_LEASE

# Mooncake picks its client's port in this range when local_hostname carries none.
_PORT_RANGE = (12300, 14300)


class StoreNotSetUpError(RuntimeError):
    """A call on a MooncakeDistributedStore before setup() succeeded, or after close()."""


class SoftPinAction(IntEnum):
    PRESERVE = 0
    ENABLE = 1
    DISABLE = 2


class ObjectDataType(IntEnum):
    UNKNOWN = 0
    KVCACHE = 1
    TENSOR = 2
    WEIGHT = 3
    SAMPLE = 4
    ACTIVATION = 5
    GRADIENT = 6
    OPTIMIZER_STATE = 7
    METADATA = 8
    GENERAL = 9


class ReplicaStatus(IntEnum):
    UNDEFINED = 0
    INITIALIZED = 1
    PROCESSING = 2
    COMPLETE = 3
    REMOVED = 4
    FAILED = 5


_U64_MAX = (1 << 64) - 1


class ReplicateConfig:
    """How a put stores its object (Mooncake's ReplicateConfig, every field).

    kvpool honours replica_num (copies on distinct segments), with_hard_pin (never evicted),
    soft_pin_action ENABLE (evicted only when nothing unpinned can go) and
    prefer_alloc_in_same_node / preferred_segment(s) naming this process's own segment (placed
    on this host when it has room). nof/dfs replicas, soft_pin_ttl_ms, data_type and group_ids
    are kept and have no effect.
    """

    __slots__ = ("replica_num", "nof_replica_num", "dfs_replica_num", "soft_pin_action",
                 "_soft_pin_ttl_ms", "with_hard_pin", "preferred_segments",
                 "preferred_nof_segments", "preferred_segment", "prefer_alloc_in_same_node",
                 "data_type", "group_ids", "host_id")

    def __init__(self):
        self.replica_num = 1
        self.nof_replica_num = 0
        self.dfs_replica_num = 0
        self.soft_pin_action = SoftPinAction.PRESERVE
        self._soft_pin_ttl_ms = None
        self.with_hard_pin = False
        self.preferred_segments = []
        self.preferred_nof_segments = []
        self.preferred_segment = ""
        self.prefer_alloc_in_same_node = False
        self.data_type = ObjectDataType.UNKNOWN
        self.group_ids = None
        self.host_id = ""

    @property
    def soft_pin_ttl_ms(self):
        """None (the master's default) or a TTL in ms, an unsigned 64-bit integer."""
        return self._soft_pin_ttl_ms

    @soft_pin_ttl_ms.setter
    def soft_pin_ttl_ms(self, value):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                  or value < 0 or value > _U64_MAX):
            raise TypeError("soft_pin_ttl_ms must be None or an integer in [0, 2**64)")
        self._soft_pin_ttl_ms = value

    # Older Mooncake releases (and engines written for them) use a with_soft_pin bool.
    @property
    def with_soft_pin(self):
        return self.soft_pin_action == SoftPinAction.ENABLE

    @with_soft_pin.setter
    def with_soft_pin(self, value):
        self.soft_pin_action = SoftPinAction.ENABLE if value else SoftPinAction.PRESERVE

    def __str__(self):
        ttl = "default" if self._soft_pin_ttl_ms is None else self._soft_pin_ttl_ms
        return (f"ReplicateConfig: {{ replica_num: {self.replica_num}, nof_replica_num: "
                f"{self.nof_replica_num}, dfs_replica_num: {self.dfs_replica_num}, "
                f"soft_pin_action: {SoftPinAction(self.soft_pin_action).name}, soft_pin_ttl_ms: "
                f"{ttl}, with_hard_pin: {int(bool(self.with_hard_pin))}, preferred_segments: "
                f"[{', '.join(self.preferred_segments)}], prefer_alloc_in_same_node: "
                f"{int(bool(self.prefer_alloc_in_same_node))} }}")

    __repr__ = __str__


class MemoryDescriptor:
    """Where a memory replica lives: buffer_descriptor (a Descriptor)."""

    def __init__(self, buffer_descriptor=None):
        self.buffer_descriptor = buffer_descriptor


class DiskDescriptor:
    """A disk replica (kvpool has none: never returned)."""

    def __init__(self, file_path="", object_size=0):
        self.file_path = file_path
        self.object_size = object_size


class Descriptor:
    """A replica's buffer: size, buffer_address (offset in its segment), transport_endpoint."""

    def __init__(self, size=0, buffer_address=0, transport_endpoint=""):
        self.size = size
        self.buffer_address = buffer_address
        self.transport_endpoint = transport_endpoint

    def __repr__(self):
        return (f"<Descriptor size={self.size} buffer_address={self.buffer_address} "
                f"transport_endpoint={self.transport_endpoint}>")


class ReplicaDescriptor:
    """One replica of an object; kvpool's replicas are all in memory and complete."""

    def __init__(self, descriptor, status=ReplicaStatus.COMPLETE):
        self.status = status
        self._memory = MemoryDescriptor(descriptor)

    def is_memory_replica(self):
        return True

    def is_disk_replica(self):
        return False

    def is_local_disk_replica(self):
        return False

    def get_memory_descriptor(self):
        return self._memory

    def get_disk_descriptor(self):
        raise RuntimeError("kvpool replicas are in memory: there is no disk descriptor")


class BufferHandle(bytearray):
    """A value read by get_buffer: bytes-like (buffer protocol, len), plus ptr() and size()."""

    def ptr(self):
        if len(self) == 0:
            return 0
        return ctypes.addressof((ctypes.c_char * len(self)).from_buffer(self))

    def size(self):
        return len(self)


class MooncakeHostMemAllocator:
    """Page-aligned host memory for transfer buffers: alloc(size) -> address, free(address)."""

    def __init__(self):
        self._maps = {}

    def alloc(self, size):
        if size <= 0:
            return 0
        region = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        address = ctypes.addressof(ctypes.c_char.from_buffer(region))
        self._maps[address] = region
        return address

    def free(self, ptr):
        region = self._maps.pop(ptr, None)
        if region is None:
            return -1
        region.close()
        return 0


def _pin_of(config):
    if config is None:
        return 1, 0
    pin = 0
    if getattr(config, "with_hard_pin", False):
        pin = 2
    elif getattr(config, "soft_pin_action", SoftPinAction.PRESERVE) == SoftPinAction.ENABLE or \
            getattr(config, "with_soft_pin", False) is True:
        pin = 1
    return max(1, int(getattr(config, "replica_num", 1) or 1)), pin


def _config_error(config):
    """Why Mooncake refuses this config (INVALID_PARAMS), or None: a soft-pin TTL only goes
    with soft_pin_action ENABLE."""
    if config is None:
        return None
    if getattr(config, "soft_pin_ttl_ms", None) is not None and \
            getattr(config, "soft_pin_action", SoftPinAction.PRESERVE) != SoftPinAction.ENABLE:
        return "soft_pin_ttl_ms is set but soft_pin_action is not ENABLE"
    return None


def _parse_size(value):
    """Mooncake's size strings ("16MB", "16 MB", "4GiB", 1024); ValueError for others."""
    if isinstance(value, bool):
        raise ValueError(f"not a size: {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"negative size {value}")
        return value
    text = str(value).strip().replace(" ", "").upper()
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([KMGT]?I?B?)?", text)
    if not match:
        raise ValueError(f"not a size: {value!r}")
    number, unit = match.group(1), (match.group(2) or "").rstrip("B").rstrip("I")
    scale = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}[unit]
    return int(float(number) * scale)


def _truthy(value):
    return str(value).strip().lower() in ("1", "true", "yes", "on")


def _split_host(local_hostname):
    """(host, port or None) from "name", "ip", "name:port", "[v6]:port" or a bare v6 literal."""
    text = local_hostname.strip()
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        return host, int(rest[1:]) if rest.startswith(":") and rest[1:] else None
    if text.count(":") == 1:
        host, port = text.split(":")
        return host, int(port)
    return text, None


def _resolve(host):
    """The address the native store binds for host (common/net.h's ResolveHost: its first IPv4
    address, else IPv6; "localhost" is 127.0.0.1 even without /etc/hosts)."""
    return _kvpool.resolve_host(host)


def _port_is_free(host_ip, port):
    family = socket.AF_INET6 if ":" in host_ip else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        try:
            s.bind((host_ip, port))
            return True
        except OSError:
            return False


def _free_port(host_ip):
    """A free TCP port in Mooncake's client range on host_ip, or 0 (any) if none is."""
    candidates = list(range(*_PORT_RANGE))
    random.shuffle(candidates)
    return next((p for p in candidates[:200] if _port_is_free(host_ip, p)), 0)


class MooncakeDistributedStore(_parallel.ParallelismMixin, _sessions.SessionMixin,
                               _tasks.TaskMixin, _kvpool.Store):
    """Mooncake's MooncakeDistributedStore over a kvpool pool (see the module docstring)."""

    def __init__(self):
        super().__init__()
        self._hostname = ""
        self._local_buffer_size = 0
        self._warned = set()

    # --- set-up -------------------------------------------------------------------------

    def _require(self, method):
        if not self.is_setup:
            raise StoreNotSetUpError(
                f"MooncakeDistributedStore.{method}: the store is not set up (call setup() "
                "first; it returns 0 on success)")

    def _warn_once(self, what):
        if what not in self._warned:
            self._warned.add(what)
            warnings.warn(f"kvpool: {what}", RuntimeWarning, stacklevel=3)
            _log.warning("kvpool: %s", what)

    def setup(self, local_hostname, metadata_server=None, global_segment_size=16 << 20,
              local_buffer_size=16 << 20, protocol="tcp", rdma_devices="",
              master_server_addr="127.0.0.1:50051", engine=None, enable_ssd_offload=False,
              ssd_offload_path="", tenant_id="default", enable_client_http_server=False,
              client_http_port=9300):
        """Mooncake's setup, positional or keyword, or setup(config: dict) with the same keys
        (values as Mooncake reads them: strings or numbers). Returns 0 or a negative code."""
        if isinstance(local_hostname, dict):
            return self._setup_dict(local_hostname)
        if metadata_server is None:
            raise TypeError("setup() needs metadata_server (or one dict argument)")
        return self._setup(dict(
            local_hostname=local_hostname, metadata_server=metadata_server,
            global_segment_size=global_segment_size, local_buffer_size=local_buffer_size,
            protocol=protocol, rdma_devices=rdma_devices, master_server_addr=master_server_addr,
            engine=engine, enable_ssd_offload=enable_ssd_offload,
            ssd_offload_path=ssd_offload_path, tenant_id=tenant_id,
            enable_client_http_server=enable_client_http_server,
            client_http_port=client_http_port))

    _DICT_KEYS = ("local_hostname", "metadata_server", "global_segment_size", "local_buffer_size",
                  "protocol", "rdma_devices", "device_name", "master_server_addr",
                  "master_server_address", "ipc_socket_path", "enable_ssd_offload",
                  "ssd_offload_path", "tenant_id", "enable_client_http_server",
                  "client_http_port", "replica_num")

    def _setup_dict(self, config):
        unknown = sorted(set(map(str, config)) - set(self._DICT_KEYS))
        if unknown:
            _log.error("setup: unknown configuration keys %s", unknown)
            return INVALID_PARAMS
        args = {str(k): v for k, v in config.items()}
        if "master_server_address" in args:
            args.setdefault("master_server_addr", args.pop("master_server_address"))
        if "device_name" in args:
            args.setdefault("rdma_devices", args.pop("device_name"))
        for flag in ("enable_ssd_offload", "enable_client_http_server"):
            if flag in args:
                args[flag] = _truthy(args[flag])
        if "ipc_socket_path" in args:
            self._warn_once("setup: ipc_socket_path has no effect (kvpool's clients find "
                            "same-host segments through the master)")
        args.setdefault("local_hostname", "")
        args.setdefault("global_segment_size", 16 << 20)
        args.setdefault("local_buffer_size", 16 << 20)
        args.setdefault("master_server_addr", "127.0.0.1:50051")
        return self._setup(args)

    def _setup(self, a):
        try:
            segment = _parse_size(a["global_segment_size"])
            buffer = _parse_size(a["local_buffer_size"])
        except ValueError as e:
            _log.error("setup: %s", e)
            return INVALID_PARAMS
        protocol = str(a.get("protocol") or "tcp").lower()
        if protocol not in ("tcp", "rdma"):
            _log.error("setup: protocol %r is not available in kvpool (tcp, rdma)", protocol)
            return INVALID_PARAMS
        if a.get("engine") is not None:
            self._warn_once("setup: the engine argument (a Mooncake TransferEngine) is ignored; "
                            "kvpool moves bytes with its own transports")
        if a.get("enable_ssd_offload") or a.get("ssd_offload_path"):
            self._warn_once("setup: enable_ssd_offload / ssd_offload_path have no effect: "
                            "kvpool has no SSD offload tier (objects live in memory)")
        if a.get("enable_client_http_server"):
            self._warn_once("setup: enable_client_http_server has no effect (the master serves "
                            "/metrics; Client.MetricsText gives this client's own)")
        if str(a.get("tenant_id") or "default") != "default":
            self._warn_once("setup: tenant_id is ignored: kvpool takes the tenant from the "
                            "caller's credentials")
        hostname = str(a.get("local_hostname") or "")
        listen = hostname
        if hostname:
            try:
                host, port = _split_host(hostname)
                ip = _resolve(host)
            except (ValueError, OSError) as e:
                _log.error("setup: local_hostname %r: %s", hostname, e)
                return INVALID_PARAMS
            if segment > 0 and port and not _port_is_free(ip, port):
                # As Mooncake's client does when its port is taken (two stores of one process
                # given the same local_hostname): another port of its range.
                _log.warning("setup: port %d of %s is in use; picking another", port, hostname)
                port = None
            if port is None and segment > 0:
                port = _free_port(ip)
            if port is not None:
                shown = f"[{host}]" if ":" in host else host
                listen = f"{shown}:{port}"
        native = {
            "master_server_address": str(a.get("master_server_addr") or "127.0.0.1:50051"),
            "global_segment_size": segment,
            "local_buffer_size": buffer,
            "protocol": protocol,
            "device_name": str(a.get("rdma_devices") or ""),
            "metadata_server": str(a.get("metadata_server") or ""),
            "local_hostname": listen,
        }
        if "replica_num" in a:
            native["replica_num"] = int(a["replica_num"])
        rc = _kvpool.Store.setup(self, native)
        if rc == 0:
            self._local_buffer_size = buffer
            self._hostname = _kvpool.Store.get_hostname(self) or listen
        return rc

    def setup_dummy(self, mem_pool_size, local_buffer_size, server_address):
        """Mooncake's dummy (standalone) client: a thin client that contributes no memory.

        kvpool's clients need no local daemon: server_address is taken as the address of the
        kvpool-master, and the store sets up with no segment of its own (a same-host segment
        that admits the process is reached through shared memory). mem_pool_size is ignored.
        """
        self._warn_once("setup_dummy: kvpool needs no client daemon; the store connects to the "
                        "master directly and contributes no memory")
        return self._setup(dict(local_hostname="", metadata_server="", global_segment_size=0,
                                local_buffer_size=local_buffer_size,
                                master_server_addr=server_address))

    def init_all(self, protocol, device_name, mount_segment_size=16 << 20):
        self._require("init_all")
        return 0

    def close(self):
        """Leaves the pool (objects of this process's segment leave with it). 0."""
        self._hostname = ""
        self._stop_tasks()  # tasks in flight finish first (they copy through this client)
        return _kvpool.Store.close(self)

    def health_check(self):
        """0 healthy, 1 not set up or closed, 2 the master does not answer."""
        if not self.is_setup:
            return 1
        return 0 if self._ping() == 0 else 2

    def get_hostname(self):
        """This client's name as Mooncake gives it: local_hostname:port ("" before setup)."""
        return self._hostname if self.is_setup else ""

    # --- buffers ------------------------------------------------------------------------

    def register_buffer(self, buffer_ptr, size):
        self._require("register_buffer")
        return _kvpool.Store.register_buffer(self, buffer_ptr, size)

    def unregister_buffer(self, buffer_ptr):
        self._require("unregister_buffer")
        return _kvpool.Store.unregister_buffer(self, buffer_ptr)

    def alloc_from_mem_pool(self, size):
        """A buffer from this process's host memory (kvpool has no client daemon pool)."""
        self._require("alloc_from_mem_pool")
        if not hasattr(self, "_allocator"):
            self._allocator = MooncakeHostMemAllocator()
        return self._allocator.alloc(size)

    # --- put family ---------------------------------------------------------------------

    @staticmethod
    def _ok(code):
        # Mooncake: a key that is stored already is a successful put with nothing written.
        return OK if code in (OK, OBJECT_ALREADY_EXISTS) else code

    def _prefer_local(self, config):
        if config is None:
            return False
        if getattr(config, "prefer_alloc_in_same_node", False):
            return True
        wanted = list(getattr(config, "preferred_segments", []) or [])
        if getattr(config, "preferred_segment", ""):
            wanted.append(config.preferred_segment)
        return bool(wanted) and self._hostname in wanted

    @staticmethod
    def _preferred_segments(config):
        """The segments a ReplicateConfig names, in order: placed there first, by name."""
        if config is None:
            return []
        wanted = list(getattr(config, "preferred_segments", []) or [])
        one = getattr(config, "preferred_segment", "")
        if one and one not in wanted:
            wanted.insert(0, one)
        return [str(w) for w in wanted]

    def _check_config(self, method, config):
        why = _config_error(config)
        if why is not None:
            _log.error("%s: %s", method, why)
        return why is None

    def _put_values(self, method, keys, values, config):
        self._require(method)
        if not self._check_config(method, config):
            return [INVALID_PARAMS] * len(keys)
        if self._local_buffer_size == 0:
            _log.error("%s: local_buffer_size is 0, so this copying call has no buffer to copy "
                       "through (as in Mooncake); use the _from calls with registered memory",
                       method)
            return [BUFFER_OVERFLOW] * len(keys)
        replicas, pin = _pin_of(config)
        codes = _kvpool.Store._put_values(self, list(keys), list(values), replicas, pin,
                                          self._prefer_local(config),
                                          preferred_segments=self._preferred_segments(config))
        return [self._ok(c) for c in codes]

    def _put_ptrs(self, method, keys, ptrs, sizes, config):
        self._require(method)
        if not self._check_config(method, config):
            return [INVALID_PARAMS] * len(keys)
        replicas, pin = _pin_of(config)
        codes = _kvpool.Store._put_parts(self, list(keys), ptrs, sizes, replicas, pin,
                                         self._prefer_local(config),
                                         preferred_segments=self._preferred_segments(config))
        return [self._ok(c) for c in codes]

    def _replace(self, keys):
        """Makes room for an upsert: removes the keys' current objects (absent is fine)."""
        codes = _kvpool.Store.batch_remove(self, list(keys), True)
        return [c if c not in (OK, OBJECT_NOT_FOUND) else OK for c in codes]

    def put(self, key, value, config=None):
        return self._put_values("put", [key], [value], config)[0]

    def put_parts(self, key, *parts, config=None):
        return self._put_values("put_parts", [key], [tuple(parts)], config)[0]

    def put_batch(self, keys, values, config=None):
        if len(keys) != len(values):
            _log.error("put_batch: %d keys but %d values", len(keys), len(values))
            return INVALID_PARAMS
        codes = self._put_values("put_batch", keys, values, config)
        return next((c for c in codes if c != OK), OK)

    def put_from(self, key, buffer_ptr, size, config=None):
        return self._put_ptrs("put_from", [key], [[buffer_ptr]], [[size]], config)[0]

    def batch_put_from(self, keys, buffer_ptrs, sizes, config=None):
        if not len(keys) == len(buffer_ptrs) == len(sizes):
            self._require("batch_put_from")
            return [INVALID_PARAMS] * len(keys)
        return self._put_ptrs("batch_put_from", keys, [[p] for p in buffer_ptrs],
                              [[s] for s in sizes], config)

    def batch_put_from_multi_buffers(self, keys, all_buffer_ptrs, all_sizes, config=None):
        return self._put_ptrs("batch_put_from_multi_buffers", keys, all_buffer_ptrs, all_sizes,
                              config)

    def put_from_with_metadata(self, key, buffer_ptr, metadata_buffer_ptr, size, metadata_size,
                               config=None):
        """Stores metadata followed by data as one object."""
        return self._put_ptrs("put_from_with_metadata", [key],
                              [[metadata_buffer_ptr, buffer_ptr]], [[metadata_size, size]],
                              config)[0]

    def upsert(self, key, value, config=None):
        self._require("upsert")
        if not self._check_config("upsert", config):
            return INVALID_PARAMS
        rc = self._replace([key])[0]
        return rc if rc != OK else self.put(key, value, config)

    def upsert_parts(self, key, *parts, config=None):
        self._require("upsert_parts")
        return self.upsert(key, tuple(parts), config)

    def upsert_batch(self, keys, values, config=None):
        self._require("upsert_batch")
        if not self._check_config("upsert_batch", config):
            return INVALID_PARAMS
        if len(keys) != len(values):
            return INVALID_PARAMS
        bad = next((c for c in self._replace(keys) if c != OK), OK)
        return bad if bad != OK else self.put_batch(keys, values, config)

    def upsert_from(self, key, buffer_ptr, size, config=None):
        self._require("upsert_from")
        if not self._check_config("upsert_from", config):
            return INVALID_PARAMS
        rc = self._replace([key])[0]
        return rc if rc != OK else self.put_from(key, buffer_ptr, size, config)

    def batch_upsert_from(self, keys, buffer_ptrs, sizes, config=None):
        self._require("batch_upsert_from")
        if not self._check_config("batch_upsert_from", config):
            return [INVALID_PARAMS] * len(keys)
        cleared = self._replace(keys)
        results = self.batch_put_from(keys, buffer_ptrs, sizes, config)
        return [c if c != OK else r for c, r in zip(cleared, results)]

    # --- get family ---------------------------------------------------------------------

    def _values(self, method, keys):
        self._require(method)
        return _kvpool.Store._get_values(self, list(keys))

    def get(self, key):
        """The value, or b"" if the key is absent (or the read failed, logged)."""
        value = self._values("get", [key])[0]
        return value if isinstance(value, bytes) else b""

    def get_batch(self, keys):
        return [v if isinstance(v, bytes) else b"" for v in self._values("get_batch", keys)]

    def get_buffer(self, key):
        value = self._values("get_buffer", [key])[0]
        return BufferHandle(value) if isinstance(value, bytes) else None

    def batch_get_buffer(self, keys):
        return [BufferHandle(v) if isinstance(v, bytes) else None
                for v in self._values("batch_get_buffer", keys)]

    def get_size(self, key):
        self._require("get_size")
        return _kvpool.Store.get_size(self, key)

    def get_into(self, key, buffer_ptr, size):
        self._require("get_into")
        return _kvpool.Store.get_into(self, key, buffer_ptr, size)

    def batch_get_into(self, keys, buffer_ptrs, sizes):
        self._require("batch_get_into")
        return _kvpool.Store.batch_get_into(self, keys, buffer_ptrs, sizes)

    def batch_get_into_multi_buffers(self, keys, all_buffer_ptrs, all_sizes,
                                     prefer_alloc_in_same_node=False):
        self._require("batch_get_into_multi_buffers")
        return _kvpool.Store.batch_get_into_multi_buffers(self, keys, all_buffer_ptrs, all_sizes,
                                                          prefer_alloc_in_same_node)

    def get_into_ranges(self, buffer_ptrs, all_keys, all_dst_offsets, all_src_offsets,
                        all_sizes):
        """Buffer-major range reads: for buffer i and its j-th key, copies
        value[src:src+size] to buffer_i[dst:dst+size] for each range; per range the bytes
        copied or a negative code (all ranges of a key fail together)."""
        self._require("get_into_ranges")
        if not (len(buffer_ptrs) == len(all_keys) == len(all_dst_offsets) ==
                len(all_src_offsets) == len(all_sizes)):
            return [[[INVALID_PARAMS]] for _ in buffer_ptrs]
        unique = sorted({k for keys in all_keys for k in keys})
        fetched = dict(zip(unique, _kvpool.Store._get_values(self, unique))) if unique else {}
        registered = _kvpool.Store.registered_buffers(self)
        out = []
        for ptr, keys, dsts, srcs, sizes in zip(buffer_ptrs, all_keys, all_dst_offsets,
                                                all_src_offsets, all_sizes):
            limit = next((base + n - ptr for base, n in registered if base <= ptr < base + n),
                         None)
            per_buffer = []
            if not (len(keys) == len(dsts) == len(srcs) == len(sizes)):
                out.append([[INVALID_PARAMS] for _ in keys])
                continue
            for key, d, s, n in zip(keys, dsts, srcs, sizes):
                value = fetched.get(key)
                if not (len(d) == len(s) == len(n)):
                    per_buffer.append([INVALID_PARAMS] * max(1, len(d), len(s), len(n)))
                    continue
                if not isinstance(value, bytes):
                    per_buffer.append([value if isinstance(value, int) else OBJECT_NOT_FOUND]
                                      * len(d))
                    continue
                bad = any(src < 0 or src + size > len(value) or dst < 0 or
                          (limit is not None and dst + size > limit)
                          for dst, src, size in zip(d, s, n))
                if bad:
                    per_buffer.append([INVALID_PARAMS] * len(d))
                    continue
                # Host or device memory: the module writes either.
                codes = [_kvpool.Store._write_bytes(self, ptr + dst, value[src:src + size])
                         for dst, src, size in zip(d, s, n)]
                failed = next((c for c in codes if c != OK), None)
                per_buffer.append(list(n) if failed is None else [failed] * len(d))
            out.append(per_buffer)
        return out

    # --- existence and removal ----------------------------------------------------------

    def is_exist(self, key):
        self._require("is_exist")
        return _kvpool.Store.is_exist(self, key)

    def batch_is_exist(self, keys):
        self._require("batch_is_exist")
        return _kvpool.Store.batch_is_exist(self, keys)

    def remove(self, key, force=False):
        self._require("remove")
        return _kvpool.Store.remove(self, key, force)

    def batch_remove(self, keys, force=False):
        self._require("batch_remove")
        return _kvpool.Store.batch_remove(self, keys, force)

    def remove_all(self, force=False):
        self._require("remove_all")
        return _kvpool.Store.remove_all(self, force)

    def remove_by_regex(self, regex_pattern, force=False):
        """Removes the objects whose keys the pattern matches somewhere in; returns how many,
        or a negative code (-600 for a malformed pattern). The master matches with RE2:
        Mooncake's ECMAScript syntax without backreferences and lookaround, in linear time."""
        self._require("remove_by_regex")
        return _kvpool.Store._remove_by_regex(self, regex_pattern, force)

    def batch_replica_clear(self, keys, segment_name=""):
        """Drops the keys' replicas, everywhere (the whole object) or only the replica on
        segment_name (the object stays readable from its other replicas; one whose only
        replica that was is removed); returns the keys cleared. A key a reader holds a lease
        on, or that has no replica on segment_name, is skipped, as by Mooncake's master."""
        self._require("batch_replica_clear")
        keys = list(keys)
        if not keys:
            return []
        if segment_name:
            codes = _kvpool.Store._drop_replicas(self, keys, segment_name, False)
        else:
            codes = _kvpool.Store.batch_remove(self, keys, False)
        return [k for k, c in zip(keys, codes) if c == OK]

    def get_replica_desc(self, key):
        return self.batch_get_replica_desc([key]).get(key, [])

    def batch_get_replica_desc(self, keys):
        """{key: [ReplicaDescriptor]} for the keys that exist (a lease is taken, as by get)."""
        self._require("batch_get_replica_desc")
        out = {}
        for key, replicas in zip(keys, _kvpool.Store._replicas(self, list(keys))):
            if isinstance(replicas, int):
                continue
            descs = []
            for segment_name, endpoint, offset, length in replicas:
                # Mooncake's transport_endpoint is the segment's name (its client's
                # local_hostname:port); kvpool's data-plane address is `endpoint`.
                d = ReplicaDescriptor(Descriptor(length, offset, segment_name))
                d.segment_name = segment_name
                d.endpoint = endpoint
                descs.append(d)
            out[key] = descs
        return out

    # --- tensors ------------------------------------------------------------------------

    def _put_tensors(self, method, keys, tensors, config, upsert=False, shard=None):
        self._require(method)
        if not self._check_config(method, config):
            return [INVALID_PARAMS] * len(keys)
        items = []
        try:
            for t in tensors:
                t = _tensor.check_tensor(t)
                items.append((t, _tensor.serialize(t, *(shard or ()))))
        except (TypeError, ValueError) as e:
            _log.error("%s: %s", method, e)
            return [INVALID_PARAMS] * len(keys)
        if len(items) != len(keys):
            _log.error("%s: %d keys but %d tensors", method, len(keys), len(items))
            return [INVALID_PARAMS] * len(keys)
        if upsert:
            self._replace(keys)
        replicas, pin = _pin_of(config)
        ptrs, sizes, keepalive = [], [], []
        for _, (head, data) in items:
            head_buf = ctypes.create_string_buffer(head, len(head))
            keepalive.append(head_buf)
            p, s = [ctypes.addressof(head_buf)], [len(head)]
            n = len(data) if not hasattr(data, "nbytes") else data.nbytes
            if n:
                p.append(data.ctypes.data)
                s.append(n)
            ptrs.append(p)
            sizes.append(s)
        codes = _kvpool.Store._put_parts(self, list(keys), ptrs, sizes, replicas, pin,
                                         self._prefer_local(config),
                                         preferred_segments=self._preferred_segments(config))
        return [self._ok(c) for c in codes]

    def put_tensor(self, key, tensor):
        return self._put_tensors("put_tensor", [key], [tensor], None)[0]

    def pub_tensor(self, key, tensor, config=None):
        return self._put_tensors("pub_tensor", [key], [tensor], config)[0]

    def upsert_tensor(self, key, tensor, config=None):
        return self._put_tensors("upsert_tensor", [key], [tensor], config, upsert=True)[0]

    def upsert_pub_tensor(self, key, tensor, config=None):
        return self._put_tensors("upsert_pub_tensor", [key], [tensor], config, upsert=True)[0]

    def batch_put_tensor(self, keys, tensors_list):
        return self._put_tensors("batch_put_tensor", keys, tensors_list, None)

    def batch_pub_tensor(self, keys, tensors_list, config=None):
        return self._put_tensors("batch_pub_tensor", keys, tensors_list, config)

    def batch_upsert_tensor(self, keys, tensors_list, config=None):
        return self._put_tensors("batch_upsert_tensor", keys, tensors_list, config, upsert=True)

    def batch_upsert_pub_tensor(self, keys, tensors_list, config=None):
        return self._put_tensors("batch_upsert_pub_tensor", keys, tensors_list, config,
                                 upsert=True)

    def _check_tensor_buffer(self, method, buffer_ptr, size):
        if size < _tensor.HEADER_SIZE:
            _log.error("%s: %d bytes cannot hold a tensor object (header %d)", method, size,
                       _tensor.HEADER_SIZE)
            return False
        head = _kvpool.Store._read_bytes(self, buffer_ptr, _tensor.HEADER_SIZE)
        if not isinstance(head, bytes):
            return False
        try:
            _tensor.parse(head, size)
        except _tensor.TensorFormatError as e:
            _log.error("%s: %s", method, e)
            return False
        return True

    def put_tensor_from(self, key, buffer_ptr, size, config=None):
        """Stores a serialized tensor object (header + data) that sits in a buffer."""
        self._require("put_tensor_from")
        if not self._check_tensor_buffer("put_tensor_from", buffer_ptr, size):
            return INVALID_PARAMS
        return self.put_from(key, buffer_ptr, size, config)

    def batch_put_tensor_from(self, keys, buffer_ptrs, sizes, config=None):
        self._require("batch_put_tensor_from")
        return [self.put_tensor_from(k, p, s, config) for k, p, s in zip(keys, buffer_ptrs, sizes)]

    def upsert_tensor_from(self, key, buffer_ptr, size, config=None):
        self._require("upsert_tensor_from")
        if not self._check_tensor_buffer("upsert_tensor_from", buffer_ptr, size):
            return INVALID_PARAMS
        return self.upsert_from(key, buffer_ptr, size, config)

    def batch_upsert_tensor_from(self, keys, buffer_ptrs, sizes, config=None):
        self._require("batch_upsert_tensor_from")
        return [self.upsert_tensor_from(k, p, s, config)
                for k, p, s in zip(keys, buffer_ptrs, sizes)]

    def _tensors(self, method, keys):
        out = []
        for key, value in zip(keys, self._values(method, keys)):
            if not isinstance(value, bytes):
                out.append(None)
                continue
            buf = bytearray(value)
            try:
                out.append(_tensor.tensor_from(buf, _tensor.parse(buf)))
            except _tensor.TensorFormatError as e:
                _log.error("%s(%s): %s", method, key, e)
                out.append(None)
        return out

    def get_tensor(self, key):
        """The tensor stored under key (CPU), or None."""
        return self._tensors("get_tensor", [key])[0]

    def batch_get_tensor(self, keys):
        return self._tensors("batch_get_tensor", list(keys))

    def get_tensor_into(self, key, buffer_ptr, size):
        """Reads the tensor object into the buffer; a tensor over the buffer's data, or None."""
        return self.batch_get_tensor_into([key], [buffer_ptr], [size])[0]

    def batch_get_tensor_into(self, keys, buffer_ptrs, sizes):
        self._require("batch_get_tensor_into")
        if not len(keys) == len(buffer_ptrs) == len(sizes):
            # Mooncake: lists that do not line up fail every key with INVALID_PARAMS.
            _log.error("batch_get_tensor_into: %d keys, %d buffers, %d sizes", len(keys),
                       len(buffer_ptrs), len(sizes))
            return [INVALID_PARAMS] * len(keys)
        results = _kvpool.Store.batch_get_into(self, list(keys), list(buffer_ptrs), list(sizes))
        out = []
        for key, ptr, size, n in zip(keys, buffer_ptrs, sizes, results):
            if n < 0:
                out.append(None)
                continue
            try:
                if _kvpool.Store._on_device(self, ptr):
                    head = _kvpool.Store._read_bytes(self, ptr, min(n, _tensor.HEADER_SIZE))
                    if not isinstance(head, bytes):
                        out.append(None)
                        continue
                    out.append(_tensor.device_tensor_from(ptr, _tensor.parse(head, n)))
                else:
                    buf = (ctypes.c_char * n).from_address(ptr)
                    out.append(_tensor.tensor_from(buf, _tensor.parse(buf, n)))
            except _tensor.TensorFormatError as e:
                _log.error("get_tensor_into(%s): %s", key, e)
                out.append(None)
        return out

    def get_tensor_into_cuda(self, key, tensor):
        return self.batch_get_tensor_into_cuda([key], [tensor])[0]

    def batch_get_tensor_into_cuda(self, keys, tensors_list):
        """Copies each stored tensor into the given (CUDA or CPU) tensor of the same shape and
        dtype; returns the destination tensors (None where absent or mismatched)."""
        out = []
        for key, src, dst in zip(keys, self.batch_get_tensor(keys), tensors_list):
            if src is None or tuple(src.shape) != tuple(dst.shape) or src.dtype != dst.dtype:
                out.append(None)
                continue
            dst.copy_(src)
            out.append(dst)
        return out

    # tensor parallelism: shard i of key is stored as key_tp_i.
    @staticmethod
    def _tp_key(key, rank):
        return f"{key}_tp_{rank}"

    def _tp_shards(self, tensor, tp_size, split_dim):
        t = _tensor.check_tensor(tensor)
        if not -t.dim() <= split_dim < t.dim():
            raise ValueError(f"split_dim {split_dim} out of range for a {t.dim()}-d tensor")
        return [c.contiguous() for c in t.chunk(tp_size, dim=split_dim)], list(t.shape), \
            split_dim % t.dim()

    def _put_with_tp(self, method, keys, tensors, config, tp_size, split_dim, upsert=False):
        self._require(method)
        results = []
        for key, tensor in zip(keys, tensors):
            if tp_size <= 1:
                results.append(self._put_tensors(method, [key], [tensor], config, upsert)[0])
                continue
            try:
                shards, full, dim = self._tp_shards(tensor, tp_size, split_dim)
            except (TypeError, ValueError) as e:
                _log.error("%s: %s", method, e)
                results.append(INVALID_PARAMS)
                continue
            if len(shards) != tp_size or full[dim] % tp_size != 0:
                _log.error("%s: dimension %d of size %d cannot be split %d ways", method, dim,
                           full[dim], tp_size)
                results.append(INVALID_PARAMS)
                continue
            codes = []
            for rank, shard in enumerate(shards):
                axes = [(_tensor.AXIS_KINDS["tp"], 0, rank, tp_size, dim, 0, shard.shape[dim])]
                codes += self._put_tensors(method, [self._tp_key(key, rank)], [shard], config,
                                           upsert, shard=(full, axes))
            results.append(next((c for c in codes if c != OK), OK))
        return results

    def put_tensor_with_tp(self, key, tensor, tp_rank=0, tp_size=1, split_dim=0):
        return self._put_with_tp("put_tensor_with_tp", [key], [tensor], None, tp_size,
                                 split_dim)[0]

    def pub_tensor_with_tp(self, key, tensor, config=None, tp_rank=0, tp_size=1, split_dim=0):
        return self._put_with_tp("pub_tensor_with_tp", [key], [tensor], config, tp_size,
                                 split_dim)[0]

    def batch_put_tensor_with_tp(self, base_keys, tensors_list, tp_rank=0, tp_size=1,
                                 split_dim=0):
        return self._put_with_tp("batch_put_tensor_with_tp", base_keys, tensors_list, None,
                                 tp_size, split_dim)

    def batch_pub_tensor_with_tp(self, base_keys, tensors_list, config=None, tp_rank=0,
                                 tp_size=1, split_dim=0):
        return self._put_with_tp("batch_pub_tensor_with_tp", base_keys, tensors_list, config,
                                 tp_size, split_dim)

    def get_tensor_with_tp(self, key, tp_rank=0, tp_size=1, split_dim=0):
        return self.get_tensor(key if tp_size <= 1 else self._tp_key(key, tp_rank))

    def batch_get_tensor_with_tp(self, base_keys, tp_rank=0, tp_size=1):
        if tp_size <= 1:
            return self.batch_get_tensor(base_keys)
        return self.batch_get_tensor([self._tp_key(k, tp_rank) for k in base_keys])

    def get_tensor_with_tp_into(self, key, buffer_ptr, size, tp_rank=0, tp_size=1, split_dim=0):
        return self.get_tensor_into(key if tp_size <= 1 else self._tp_key(key, tp_rank),
                                    buffer_ptr, size)

    def batch_get_tensor_with_tp_into(self, base_keys, buffer_ptrs, sizes, tp_rank=0,
                                      tp_size=1, split_dim=0):
        keys = base_keys if tp_size <= 1 else [self._tp_key(k, tp_rank) for k in base_keys]
        return self.batch_get_tensor_into(keys, buffer_ptrs, sizes)

    def put_tensor_with_tp_from(self, key, buffer_ptr, size, tp_rank=0, tp_size=1, split_dim=0,
                                config=None):
        """Takes the whole serialized tensor in the buffer and stores all tp_size shards
        (key_tp_<rank>), as put_tensor_with_tp does; tp_rank does not select one."""
        self._require("put_tensor_with_tp_from")
        if not self._check_tensor_buffer("put_tensor_with_tp_from", buffer_ptr, size):
            return INVALID_PARAMS
        if tp_size <= 1:
            return self.put_from(key, buffer_ptr, size, config)
        if _kvpool.Store._on_device(self, buffer_ptr):
            head = _kvpool.Store._read_bytes(self, buffer_ptr, _tensor.HEADER_SIZE)
            tensor = _tensor.device_tensor_from(buffer_ptr, _tensor.parse(head, size))
        else:
            buf = (ctypes.c_char * size).from_address(buffer_ptr)
            tensor = _tensor.tensor_from(buf, _tensor.parse(buf, size))
        return self._put_with_tp("put_tensor_with_tp_from", [key], [tensor], config, tp_size,
                                 split_dim)[0]

    def batch_put_tensor_with_tp_from(self, base_keys, buffer_ptrs, sizes, tp_rank=0,
                                      tp_size=1, split_dim=0, config=None):
        return [self.put_tensor_with_tp_from(k, p, s, tp_rank, tp_size, split_dim, config)
                for k, p, s in zip(base_keys, buffer_ptrs, sizes)]

    # --- safetensors --------------------------------------------------------------------

    def save_tensor_to_safetensor(self, key, file_name=None):
        """Writes the tensor under key to a safetensors file (default name: the key).
        0 or a negative code."""
        self._require("save_tensor_to_safetensor")
        tensor = self.get_tensor(key)
        if tensor is None:
            return OBJECT_NOT_FOUND
        from kvpool import _safetensors
        try:
            _safetensors.save({key: tensor}, file_name or key)
        except OSError as e:
            _log.error("save_tensor_to_safetensor: %s", e)
            return INVALID_PARAMS
        return OK

    def load_tensor_from_safetensor(self, key=None, file_name=None):
        """Stores a tensor of a safetensors file under key (default: the file name): the
        tensor named key, else the file's first. Returns the tensor, or None (logged)."""
        self._require("load_tensor_from_safetensor")
        if file_name is None:
            raise TypeError("load_tensor_from_safetensor() needs file_name")
        from kvpool import _safetensors
        try:
            tensors = _safetensors.load(file_name)
        except (OSError, ValueError) as e:
            _log.error("load_tensor_from_safetensor(%s): %s", file_name, e)
            return None
        if not tensors:
            _log.error("load_tensor_from_safetensor(%s): the file holds no tensor", file_name)
            return None
        key = key if key is not None else file_name
        if key not in tensors:
            _log.warning("load_tensor_from_safetensor: %s has no tensor %r; storing its first",
                         file_name, key)
        tensor = tensors.get(key, next(iter(tensors.values())))
        rc = self.put_tensor(key, tensor)
        if rc != OK:
            _log.error("load_tensor_from_safetensor: storing %r failed (%d)", key, rc)
            return None
        return tensor
