"""kvpool.store.MooncakeDistributedStore against real kvpool-master / kvpool-segment processes:
Mooncake's names, signatures and return conventions, call by call."""

import ctypes
import socket
import urllib.request

import pytest
import torch

import kvpool
from kvpool.store import (MooncakeDistributedStore, MooncakeHostMemAllocator, ReplicaDescriptor,
                          ReplicateConfig, SoftPinAction, StoreNotSetUpError)

NOT_FOUND = kvpool.OBJECT_NOT_FOUND


@pytest.fixture
def mc(pool):
    """A MooncakeDistributedStore set up as Mooncake's tests do: positional, "localhost",
    contributing a 32 MiB segment, against a master with no embedded segment."""
    master = pool.master(embedded_segment_size="0")
    store = MooncakeDistributedStore()
    assert store.setup("localhost", "http://127.0.0.1:8080/metadata", 32 << 20, 16 << 20, "tcp",
                       "", master) == 0
    store.master = master
    yield store
    store.close()


def buffer(n, fill=0):
    buf = (ctypes.c_ubyte * n)()
    ctypes.memset(buf, fill, n)
    return buf, ctypes.addressof(buf)


def test_replicate_config_fields_and_checks():
    c = ReplicateConfig()
    assert (c.replica_num, c.with_hard_pin, c.soft_pin_action, c.soft_pin_ttl_ms) == (
        1, False, SoftPinAction.PRESERVE, None)
    assert (c.preferred_segments, c.preferred_segment, c.prefer_alloc_in_same_node) == (
        [], "", False)
    c.soft_pin_ttl_ms = 1000
    assert c.soft_pin_ttl_ms == 1000
    for bad in (-1, 1 << 64, "10"):
        with pytest.raises(TypeError):
            c.soft_pin_ttl_ms = bad
    c.with_soft_pin = True  # the older API's bool
    assert c.soft_pin_action == SoftPinAction.ENABLE
    assert "replica_num: 1" in str(c)
    with pytest.raises(AttributeError):
        c.no_such_field = 1


def test_every_call_on_a_store_never_set_up_fails_clearly():
    store = MooncakeDistributedStore()
    assert store.health_check() == 1
    assert store.get_hostname() == ""
    assert store.close() == 0
    for call in (lambda: store.put("k", b"v"), lambda: store.get("k"),
                 lambda: store.is_exist("k"), lambda: store.batch_put_from(["k"], [1], [1]),
                 lambda: store.get_tensor("k"), lambda: store.remove_by_regex("k"),
                 lambda: store.register_buffer(1, 1)):
        with pytest.raises(StoreNotSetUpError, match="not set up"):
            call()


def test_local_hostname_resolves_like_the_native_store():
    """One resolver for both halves: "localhost" is loopback without asking /etc/hosts (a
    minimal root has none), this machine's own name always answers, a stranger's does not."""
    from kvpool import _kvpool
    assert _kvpool.resolve_host("localhost") == "127.0.0.1"
    assert _kvpool.resolve_host("LOCALHOST") == "127.0.0.1"
    assert _kvpool.resolve_host("10.1.2.3") == "10.1.2.3"
    assert _kvpool.resolve_host(socket.gethostname())
    with pytest.raises(ValueError, match="does not resolve"):
        _kvpool.resolve_host("no-such-host.invalid")


def test_setup_accepts_names_ports_dicts_and_unknown_features(pool):
    master = pool.master()
    for host in ("localhost", "127.0.0.1", socket.gethostname(), "localhost:0"):
        store = MooncakeDistributedStore()
        assert store.setup(host, "P2PHANDSHAKE", 1 << 20, 1 << 20, "tcp", "", master) == 0, host
        name = store.get_hostname()
        assert name.startswith(host.split(":")[0] + ":"), (host, name)
        if ":" not in host:
            assert 12300 <= int(name.rsplit(":", 1)[1]) < 14300  # Mooncake's port range
        assert store.put("p", b"x") == 0 and store.get("p") == b"x"
        store.close()
    store = MooncakeDistributedStore()
    with pytest.warns(RuntimeWarning, match="SSD offload"):
        assert store.setup("localhost", "P2PHANDSHAKE", 0, 1 << 20, "tcp", "", master, None,
                           enable_ssd_offload=True, ssd_offload_path="/tmp/x",
                           tenant_id="default", enable_client_http_server=False,
                           client_http_port=9300) == 0
    store.close()
    # setup(dict) with Mooncake's keys and value types (everything may be a string).
    assert store.setup({"local_hostname": "localhost", "metadata_server": "P2PHANDSHAKE",
                        "global_segment_size": "16 MB", "local_buffer_size": "16MB",
                        "protocol": "tcp", "rdma_devices": "", "master_server_addr": master,
                        "enable_ssd_offload": "false", "tenant_id": "default"}) == 0
    assert store.put("d", b"dict") == 0 and store.get("d") == b"dict"
    store.close()
    assert store.setup({"local_hostname": "localhost", "metadata_server": "x",
                        "global_segment_size": "50%", "master_server_addr": master}) != 0
    assert store.setup({"local_hostname": "no-such-host.invalid", "metadata_server": "x",
                        "master_server_addr": master}) == kvpool.INVALID_PARAMS
    assert store.setup({"bogus_key": 1, "master_server_addr": master}) == kvpool.INVALID_PARAMS
    assert store.setup("localhost", "x", 0, 0, "cxl", "", master) == kvpool.INVALID_PARAMS
    assert not store.is_setup


def test_put_family_returns_zero_and_dedups_like_mooncake(mc):
    assert mc.put("a", b"alpha") == 0
    assert mc.put("a", b"other") == 0  # stored already: success, nothing written
    assert mc.get("a") == b"alpha"
    assert mc.put_parts("parts", b"he", bytearray(b"ll"), memoryview(b"o")) == 0
    assert mc.get("parts") == b"hello"
    assert mc.put_batch(["b1", "b2"], [b"one", b"two"]) == 0
    assert mc.get_batch(["b1", "b2", "missing"]) == [b"one", b"two", b""]
    buf, ptr = buffer(64, 7)
    assert mc.register_buffer(ptr, 64) == 0
    assert mc.put_from("from", ptr, 64) == 0
    assert mc.batch_put_from(["f1", "f2"], [ptr, ptr + 32], [32, 32]) == [0, 0]
    assert mc.batch_put_from(["f1", "f3"], [ptr, ptr], [32, 32]) == [0, 0]  # f1: dedup = 0
    assert mc.batch_put_from_multi_buffers(["m"], [[ptr, ptr + 60]], [[4, 4]]) == [0]
    meta, mptr = buffer(8, 1)
    assert mc.put_from_with_metadata("meta", ptr, mptr, 16, 8) == 0
    assert mc.get("meta") == bytes([1] * 8 + [7] * 16)
    assert mc.get("m") == bytes([7] * 8)
    # Mismatched lists: every key fails with INVALID_PARAMS, nothing stored.
    assert mc.batch_put_from(["x", "y"], [ptr], [8]) == [kvpool.INVALID_PARAMS] * 2
    assert mc.is_exist("x") == 0
    assert mc.unregister_buffer(ptr) == 0


def test_put_takes_a_replicate_config(pool):
    master = pool.master(embedded_segment_size="0")
    pool.segment(master, "16MiB")
    pool.segment(master, "16MiB")
    store = MooncakeDistributedStore()
    assert store.setup("localhost", "P2PHANDSHAKE", 0, 1 << 20, "tcp", "", master) == 0
    config = ReplicateConfig()
    config.replica_num = 2
    config.with_hard_pin = True
    assert store.put("two", b"x" * 100, config) == 0
    replicas = store.get_replica_desc("two")
    assert len(replicas) == 2
    assert all(isinstance(r, ReplicaDescriptor) and r.is_memory_replica() for r in replicas)
    endpoints = {r.get_memory_descriptor().buffer_descriptor.transport_endpoint for r in replicas}
    assert len(endpoints) == 2
    assert all(r.get_memory_descriptor().buffer_descriptor.size == 100 for r in replicas)
    assert store.batch_get_replica_desc(["two", "missing"]).keys() == {"two"}
    store.close()


def test_batch_replica_clear_drops_one_segments_replica(pool):
    master = pool.master(embedded_segment_size="0")
    a = pool.segment(master, "16MiB")
    b = pool.segment(master, "16MiB")
    store = MooncakeDistributedStore()
    assert store.setup("localhost", "P2PHANDSHAKE", 0, 1 << 20, "tcp", "", master) == 0
    config = ReplicateConfig()
    config.replica_num = 2
    assert store.put("k", b"both" * 100, config) == 0
    assert store.put("w", b"whole") == 0
    # The replica on a goes, the one on b stays and serves reads.
    assert store.batch_replica_clear(["k", "absent"], segment_name=a) == ["k"]
    assert store.get("k") == b"both" * 100
    assert [d.segment_name for d in store.get_replica_desc("k")] == [b]
    # Those reads leased k: a clear is refused until the lease ends (Mooncake's master).
    assert store.batch_replica_clear(["k"], segment_name=b) == []
    assert store.batch_replica_clear(["k"], segment_name="nonexistent:1") == []
    assert store.get("k") == b"both" * 100
    # Without a segment name the whole object goes.
    assert store.batch_replica_clear(["w"]) == ["w"]
    assert store.get("w") == b""
    assert store.batch_replica_clear([]) == []
    assert store.remove("k", True) == 0
    store.close()


def test_put_and_get_sessions_by_ranges(mc):
    page, layers = 256, 3
    src, src_ptr = buffer(page * layers)
    for i in range(len(src)):
        src[i] = i % 251
    dst, dst_ptr = buffer(page * layers, fill=0xEE)
    assert mc.batch_put_session_start(["s", "bad"], [page * layers, 0]) == [
        0, kvpool.INVALID_PARAMS]
    for layer in reversed(range(layers)):  # any order; the object is visible only at the end
        rcs = mc.batch_put_from_multi_buffer_ranges(["s"], [[src_ptr + layer * page]], [[page]],
                                                    [[layer * page]])
        assert rcs == [page]
        assert mc.is_exist("s") == 0
    # A range past the object, or a key without a session: refused, nothing copied.
    assert mc.batch_put_from_multi_buffer_ranges(["s", "none"], [[src_ptr], [src_ptr]],
                                                 [[page * layers + 1], [1]], [[0], [0]]) == [
        kvpool.INVALID_PARAMS, kvpool.INVALID_PARAMS]
    assert mc.batch_put_session_end(["s", "none"]) == [0, kvpool.INVALID_PARAMS]
    assert mc.get("s") == bytes(src)
    assert mc.batch_get_session_start(["s", "missing"]) == [0, NOT_FOUND]
    rcs = mc.batch_get_into_multi_buffer_ranges(
        ["s", "missing"], [[dst_ptr + page, dst_ptr], [dst_ptr]], [[page, page], [1]],
        [[page, 0], [0]])
    assert rcs == [2 * page, kvpool.INVALID_PARAMS]
    assert bytes(dst)[:2 * page] == bytes(src)[:2 * page]
    assert bytes(dst)[2 * page:] == b"\xee" * page
    assert mc.batch_get_session_end(["s"]) == 0
    assert mc.batch_get_into_multi_buffer_ranges(["s"], [[dst_ptr]], [[1]], [[0]]) == [
        kvpool.INVALID_PARAMS]
    assert mc.batch_put_session_start(["r"], [10]) == [0]
    assert mc.batch_put_session_revoke(["r", "r"]) == [0, kvpool.INVALID_PARAMS]
    assert mc.batch_put_session_end(["r"]) == [kvpool.INVALID_PARAMS]
    assert mc.is_exist("r") == 0


def test_pressure_is_minus_200(pool):
    master = pool.master(embedded_segment_size="0")
    pool.segment(master, "4MiB")
    store = MooncakeDistributedStore()
    assert store.setup("localhost", "P2PHANDSHAKE", 0, 64 << 20, "tcp", "", master) == 0
    pinned = ReplicateConfig()
    pinned.with_hard_pin = True  # hard-pinned objects are never evicted
    assert store.put("fill", b"x" * (3 << 20), pinned) == 0
    assert store.put("more", b"y" * (3 << 20), pinned) == kvpool.NO_AVAILABLE_HANDLE
    store.close()


def test_get_family(mc):
    assert mc.put("v", b"0123456789") == 0
    assert mc.get_size("v") == 10
    assert mc.get_size("missing") == NOT_FOUND
    buf, ptr = buffer(16)
    assert mc.register_buffer(ptr, 16) == 0
    assert mc.get_into("v", ptr, 16) == 10
    assert bytes(buf[:10]) == b"0123456789"
    assert mc.get_into("missing", ptr, 16) == NOT_FOUND
    assert mc.get_into("v", ptr, 4) < 0  # too small
    assert mc.batch_get_into(["v", "missing"], [ptr, ptr], [16, 16]) == [10, NOT_FOUND]
    parts = (ctypes.c_ubyte * 8)()
    assert mc.batch_get_into_multi_buffers(["v"], [[ptr, ctypes.addressof(parts)]],
                                           [[4, 8]]) == [10]
    assert bytes(buf[:4]) + bytes(parts[:6]) == b"0123456789"
    handle = mc.get_buffer("v")
    assert bytes(handle) == b"0123456789" and len(handle) == 10 and handle.size() == 10
    assert ctypes.string_at(handle.ptr(), 10) == b"0123456789"
    assert memoryview(handle)[2:4].tobytes() == b"23"
    assert mc.get_buffer("missing") is None
    assert [None if h is None else bytes(h) for h in mc.batch_get_buffer(["v", "missing"])] == [
        b"0123456789", None]
    ctypes.memset(buf, ord("_"), 16)
    assert mc.get_into_ranges([ptr], [["v"]], [[[0, 8]]], [[[2, 5]]], [[[3, 2]]]) == [[[3, 2]]]
    assert bytes(buf[:10]) == b"234_____56"
    assert mc.get_into_ranges([ptr], [["v"]], [[[0]]], [[[9]]], [[[4]]])[0][0][0] < 0
    assert mc.get_into_ranges([ptr], [["v"]], [[[15]]], [[[0]]], [[[4]]])[0][0][0] < 0
    assert mc.get_into_ranges([ptr], [["missing"]], [[[0]]], [[[0]]], [[[1]]])[0][0][0] < 0
    assert mc.unregister_buffer(ptr) == 0


def test_exist_and_remove_family(mc):
    for k in ("r1", "r2", "keep", "grp/a", "grp/b"):
        assert mc.put(k, b"v") == 0
    assert mc.is_exist("r1") == 1 and mc.is_exist("zz") == 0
    assert mc.batch_is_exist(["r1", "zz"]) == [1, 0]
    assert mc.remove("r1", force=True) == 0
    assert mc.remove("r1") == NOT_FOUND
    assert mc.batch_remove(["r2", "zz"], force=True) == [0, NOT_FOUND]
    assert mc.remove_by_regex("^grp/", force=True) == 2
    assert mc.batch_is_exist(["grp/a", "grp/b", "keep"]) == [0, 0, 1]
    assert mc.remove_by_regex("([", force=True) == kvpool.INVALID_PARAMS
    assert mc.remove_by_regex("(?=k)", force=True) == kvpool.INVALID_PARAMS  # no lookaround
    # A pattern that backtracks exponentially in std::regex is linear in RE2.
    assert mc.put("a" * 4000, b"v") == 0
    assert mc.remove_by_regex("(a*)*b", force=True) == 0
    assert mc.remove_all(force=True) == 2  # "keep" and the long key
    assert mc.is_exist("keep") == 0


def test_upsert_family_replaces(mc):
    assert mc.upsert("u", b"first") == 0
    assert mc.upsert("u", b"second value") == 0
    assert mc.get("u") == b"second value"
    assert mc.upsert_parts("u", b"a", b"b") == 0 and mc.get("u") == b"ab"
    assert mc.upsert_batch(["u", "w"], [b"U", b"W"]) == 0
    assert mc.get_batch(["u", "w"]) == [b"U", b"W"]
    buf, ptr = buffer(8, 9)
    assert mc.upsert_from("u", ptr, 8) == 0 and mc.get("u") == bytes([9] * 8)
    assert mc.batch_upsert_from(["u", "w"], [ptr, ptr], [2, 3]) == [0, 0]
    assert mc.get_batch(["u", "w"]) == [bytes([9] * 2), bytes([9] * 3)]


def test_tensor_calls(mc, tmp_path):
    t = torch.arange(24, dtype=torch.float32).reshape(2, 3, 4)
    assert mc.put_tensor("t", t) == 0
    assert torch.equal(mc.get_tensor("t"), t)
    assert mc.get_tensor("missing") is None
    bf = torch.randn(5, 7).to(torch.bfloat16)
    assert mc.batch_put_tensor(["a", "b"], [bf, t[0]]) == [0, 0]
    got = mc.batch_get_tensor(["a", "b", "missing"])
    assert torch.equal(got[0], bf) and torch.equal(got[1], t[0]) and got[2] is None
    size = mc.get_size("t")
    assert size == 304 + t.numel() * 4  # Mooncake's tensor header, then the data
    buf, ptr = buffer(size + 64)
    assert mc.register_buffer(ptr, size + 64) == 0
    into = mc.get_tensor_into("t", ptr, size + 64)
    assert torch.equal(into, t) and into.data_ptr() == ptr + 304
    assert mc.put_tensor_from("t_copy", ptr, size) == 0
    assert torch.equal(mc.get_tensor("t_copy"), t)
    assert mc.put_tensor_from("junk", ptr + 304, 64) == kvpool.INVALID_PARAMS
    assert mc.batch_get_tensor_into(["t"], [ptr], [size]) [0] is not None
    assert mc.unregister_buffer(ptr) == 0
    # Tensor parallelism: shards key_tp_<rank>, split along split_dim.
    w = torch.arange(32, dtype=torch.int64).reshape(4, 8)
    assert mc.put_tensor_with_tp("w", w, tp_size=2, split_dim=1) == 0
    assert torch.equal(mc.get_tensor_with_tp("w", tp_rank=1, tp_size=2), w[:, 4:])
    assert torch.equal(mc.get_tensor("w_tp_0"), w[:, :4])
    assert [torch.equal(x, w[:, :4]) for x in mc.batch_get_tensor_with_tp(["w"], 0, 2)] == [True]
    assert mc.put_tensor_with_tp("odd", torch.zeros(3), tp_size=2) == kvpool.INVALID_PARAMS
    # Upserts replace; pub_* take a ReplicateConfig.
    assert mc.upsert_tensor("t", t * 2) == 0 and torch.equal(mc.get_tensor("t"), t * 2)
    config = ReplicateConfig()
    assert mc.pub_tensor("p", t, config) == 0 and torch.equal(mc.get_tensor("p"), t)
    assert mc.put_tensor("bad", [1, 2]) == kvpool.INVALID_PARAMS
    # safetensors round trip.
    path = str(tmp_path / "t.safetensors")
    assert mc.save_tensor_to_safetensor("p", path) == 0
    loaded = mc.load_tensor_from_safetensor("p_loaded", path)  # not in the file: its first
    assert torch.equal(loaded, t) and torch.equal(mc.get_tensor("p_loaded"), t)
    assert mc.load_tensor_from_safetensor("x", str(tmp_path / "absent.safetensors")) is None
    assert mc.save_tensor_to_safetensor("missing", path) == NOT_FOUND


def test_host_allocator_health_and_hostname(mc):
    alloc = MooncakeHostMemAllocator()
    ptr = alloc.alloc(1 << 20)
    assert ptr % 4096 == 0
    ctypes.memset(ptr, 5, 1 << 20)
    assert mc.register_buffer(ptr, 1 << 20) == 0
    assert mc.put_from("alloc", ptr, 1 << 20) == 0
    assert mc.get("alloc") == bytes([5]) * (1 << 20)
    assert mc.unregister_buffer(ptr) == 0
    assert alloc.free(ptr) == 0 and alloc.free(ptr) == -1
    assert mc.health_check() == 0
    # The segment this store contributes is named like Mooncake's client: its get_hostname().
    assert mc.get_hostname().startswith("localhost:")


def test_master_serves_get_all_segments(pool):
    proc_fields = pool.master_with_http()
    master, http = proc_fields["grpc"], proc_fields["http"]
    pool.segment(master, "8MiB")
    body = urllib.request.urlopen(f"http://{http}/get_all_segments", timeout=5).read().decode()
    names = body.splitlines()
    assert len(names) == 2 and all(":" in n for n in names)  # the embedded segment and ours


def test_tensor_calls_refuse_what_is_not_a_tensor_object(mc):
    from kvpool import _tensor
    assert mc.put("raw", b"x" * 400) == 0
    assert mc.get_tensor("raw") is None  # bad magic: None and a log line, never garbage
    t = torch.arange(6, dtype=torch.int32)
    head, data = _tensor.serialize(t)
    assert len(head) == _tensor.HEADER_SIZE == 304
    assert mc.put("short", head + bytes(data)[:-4]) == 0  # 4 data bytes missing
    assert mc.get_tensor("short") is None
    assert mc.put("whole", head + bytes(data)) == 0
    assert torch.equal(mc.get_tensor("whole"), t)
    buf, ptr = buffer(304 + 24)
    ctypes.memmove(ptr, head + bytes(data), 304 + 24)
    assert mc.register_buffer(ptr, 304 + 24) == 0
    assert mc.put_tensor_from("trunc", ptr, 304 + 20) == kvpool.INVALID_PARAMS
    assert mc.put_tensor_from("ok", ptr, 304 + 24) == 0
    assert mc.is_exist("trunc") == 0 and torch.equal(mc.get_tensor("ok"), t)
    assert mc.unregister_buffer(ptr) == 0
