"""The exact call sequences three engines' Mooncake backends make, through the opt-in
`mooncake` shim (site_mooncake/ on PYTHONPATH: `from mooncake.store import ...` is kvpool's),
against real kvpool-master / kvpool-segment processes. Each sequence is read from the engine's
source and replayed with the engine's arguments and its own success checks:

- vLLM's MooncakeStoreConnector worker (../shared/seed/): setup(dict of strings),
  register_buffer of the KV cache, batch_is_exist, batch_put_from_multi_buffers (a put failed
  when its code is < 0; -200 is pressure), batch_get_into_multi_buffers (bytes read per key).
- SGLang's HiCache MooncakeStore (python/sglang/srt/mem_cache/storage/mooncake_store/):
  setup with 8 positional arguments (the engine None) and "localhost", a 4 KiB warm-up put that
  must return 0, is_exist == 1, get == value, /get_all_segments non-empty, register_buffer of
  the host pool, batch_is_exist, batch_put_from counted done only when 0, batch_get_into > 0
  per key, remove_all.
- LMCache's MooncakestoreConnector (lmcache/v1/storage_backend/connector/): setup with 7
  positional arguments, ReplicateConfig(replica_num=1, preferred_segment=get_hostname()),
  register_buffer, put_from with the config, put_parts(metadata, data), is_exist,
  batch_get_into, batch_get_buffer read with memoryview/torch.frombuffer, unregister, close.
"""

import importlib
import os
import sys
import urllib.request

import pytest
import torch

SHIM = os.environ.get("KVPOOL_MOONCAKE_SHIM_PATH")


@pytest.fixture(scope="module")
def mooncake_store():
    if not SHIM:
        pytest.skip("KVPOOL_MOONCAKE_SHIM_PATH (site_mooncake/) not set")
    sys.path.insert(0, SHIM)
    try:
        module = importlib.import_module("mooncake.store")
        yield module
    finally:
        sys.path.remove(SHIM)


def test_the_shim_is_kvpool(mooncake_store):
    import mooncake
    import kvpool.store
    assert mooncake.BACKEND == "kvpool"
    from mooncake.store import MooncakeDistributedStore, ReplicateConfig  # what engines import
    assert MooncakeDistributedStore is kvpool.store.MooncakeDistributedStore
    assert ReplicateConfig is kvpool.store.ReplicateConfig
    for name in ("SoftPinAction", "ReplicaDescriptor", "MooncakeHostMemAllocator"):
        assert getattr(mooncake_store, name) is getattr(kvpool.store, name)


def test_vllm_connector_worker_sequence(mooncake_store, pool):
    master = pool.master(embedded_segment_size="0")
    pool.segment(master, "32MiB")
    store = mooncake_store.MooncakeDistributedStore()
    assert store.setup({
        "local_hostname": "127.0.0.1", "metadata_server": "P2PHANDSHAKE",
        "global_segment_size": str(0), "local_buffer_size": str(4 << 30), "protocol": "tcp",
        "rdma_devices": "", "master_server_addr": master}) == 0
    # FlashAttention layout (2, num_blocks, block, heads, dim) per layer: K and V regions.
    layers = [torch.randn(2, 8, 16, 2, 8, dtype=torch.float16) for _ in range(2)]
    for kv in layers:
        assert store.register_buffer(kv.data_ptr(), kv.numel() * kv.element_size()) == 0
    block_bytes = 16 * 2 * 8 * 2
    keys = [f"model@tp_rank:0@pcp0@dcp0@pp_rank:0@{h:016x}" for h in range(4)]
    addrs = [[kv[side, b].data_ptr() for kv in layers for side in (0, 1)] for b in range(4)]
    sizes = [[block_bytes] * 4 for _ in range(4)]
    states = store.batch_is_exist(keys)
    assert states == [0, 0, 0, 0]
    missing = [i for i, e in enumerate(states) if e != 1]
    res = store.batch_put_from_multi_buffers([keys[i] for i in missing],
                                             [addrs[i] for i in missing],
                                             [sizes[i] for i in missing])
    assert [i for i, v in enumerate(res) if v < 0] == []
    assert res == [0] * 4
    assert store.batch_is_exist(keys) == [1] * 4
    # A second store of the same blocks: all exist, nothing is sent.
    assert [i for i, e in enumerate(store.batch_is_exist(keys)) if e != 1] == []
    # Load into a fresh cache, the worker's tp_rank rotation of the lists included.
    fresh = [torch.zeros_like(kv) for kv in layers]
    for kv in fresh:
        assert store.register_buffer(kv.data_ptr(), kv.numel() * kv.element_size()) == 0
    dst = [[kv[side, b].data_ptr() for kv in fresh for side in (0, 1)] for b in range(4)]
    got = store.batch_get_into_multi_buffers(keys[1:] + keys[:1], dst[1:] + dst[:1],
                                             sizes[1:] + sizes[:1])
    assert got == [4 * block_bytes] * 4
    for a, b in zip(layers, fresh):
        assert torch.equal(a[:, :4], b[:, :4])
    assert store.close() == 0


def test_sglang_hicache_sequence(mooncake_store, pool):
    fields = pool.master_with_http(embedded_segment_size="0")
    master, http = fields["grpc"], fields["http"]
    store = mooncake_store.MooncakeDistributedStore()
    # check_server: the master's /get_all_segments is polled until it is non-empty.
    assert urllib.request.urlopen(f"http://{http}/get_all_segments").read() == b""
    ret = store.setup("localhost", "P2PHANDSHAKE", 32 << 20, 16 << 20, "tcp", "", master, None)
    assert not ret
    assert urllib.request.urlopen(f"http://{http}/get_all_segments").read().decode().strip() == \
        store.get_hostname()
    warmup_key, warmup_value = "sglang_mooncake_store_warmup_key0", bytes(4 * 1024)
    assert store.put(warmup_key, warmup_value) == 0
    assert store.is_exist(warmup_key) == 1
    assert store.get(warmup_key) == warmup_value
    # Host KV pool, page_first: one page is one buffer for K and one for V.
    page_bytes = 4096
    host_pool = torch.randint(0, 255, (8, 2, page_bytes), dtype=torch.uint8)
    assert store.register_buffer(host_pool.data_ptr(), host_pool.numel()) == 0
    keys = [f"page{i}_0_{kv}" for i in range(4) for kv in ("k", "v")]
    ptrs = [host_pool[i, j].data_ptr() for i in range(4) for j in range(2)]
    sizes = [page_bytes] * len(keys)
    exist = store.batch_is_exist(keys)
    set_keys = [k for k, e in zip(keys, exist) if e != 1]
    put = store.batch_put_from(set_keys, ptrs, sizes)
    # _batch_postprocess(is_set_operate=True): a page is stored when all its results are 0.
    assert [all(r == 0 for r in put[i:i + 2]) for i in range(0, len(put), 2)] == [True] * 4
    # Again: batch_set_v1 skips what exists; a dedup put also answers 0.
    assert store.batch_is_exist(keys) == [1] * len(keys)
    assert store.batch_put_from(keys[:2], ptrs[:2], sizes[:2]) == [0, 0]
    # Prefetch into other pages: every result > 0.
    dst = [host_pool[4 + i, j].data_ptr() for i in range(4) for j in range(2)]
    got = store.batch_get_into(keys, dst, sizes)
    assert [all(r > 0 for r in got[i:i + 2]) for i in range(0, len(got), 2)] == [True] * 4
    assert torch.equal(host_pool[4:], host_pool[:4])
    # clear(): remove_all() without force. The reads above leased every key (for 10 s with this
    # master, 5 s with Mooncake's), so nothing goes, as in Mooncake; the warm-up key was read too.
    assert store.remove_all() == 0
    assert store.remove_all(force=True) == len(keys) + 1
    assert store.batch_is_exist(keys) == [0] * len(keys)
    store.close()


def test_lmcache_connector_sequence(mooncake_store, pool):
    master = pool.master(embedded_segment_size="0")
    store = mooncake_store.MooncakeDistributedStore()
    store.setup("localhost", "P2PHANDSHAKE", 32 << 20, 1 << 30, "tcp", "", master)
    replica_config = mooncake_store.ReplicateConfig()
    replica_config.replica_num = 1
    replica_config.preferred_segment = store.get_hostname()  # prefer_local_alloc
    pinned = torch.zeros(1 << 20, dtype=torch.uint8)
    assert store.register_buffer(pinned.data_ptr(), pinned.numel()) == 0
    chunk = pinned[:65536]
    chunk.copy_(torch.randint(0, 255, (65536,), dtype=torch.uint8))
    key = "vllm@model@1@0@abcdef"
    # _put_without_metadata: put_from with the config (the result is not checked).
    assert store.put_from(key, chunk.data_ptr(), chunk.numel(), replica_config) == 0
    assert store.is_exist(key) == 1
    replicas = store.get_replica_desc(key)
    assert [r.get_memory_descriptor().buffer_descriptor.transport_endpoint
            for r in replicas] == [store.get_hostname()]  # placed on this host's segment
    # _batch_get_into: bytes read per key, <= 0 is a failure.
    out = pinned[65536:131072]
    assert store.batch_get_into([key], [out.data_ptr()], [out.numel()]) == [65536]
    assert torch.equal(out, chunk)
    # _put_with_metadata / _batch_get_buffer: 28 bytes of metadata, then the data.
    metadata = bytes(range(28))
    data = torch.arange(64, dtype=torch.float32)
    kv_bytes = memoryview(data.numpy()).cast("B")
    assert store.put_parts("meta_key", metadata, kv_bytes) == 0
    buffers = store.batch_get_buffer(["meta_key", "absent"])
    assert buffers[1] is None
    view = memoryview(buffers[0])
    assert bytes(view[:28]) == metadata and len(view) == 28 + 256
    back = torch.frombuffer(buffers[0], dtype=torch.float32, offset=28, count=64)
    assert torch.equal(back, data)
    assert store.unregister_buffer(pinned.data_ptr()) == 0
    assert store.close() == 0
