"""kvpool.Store, the native store under kvpool.store.MooncakeDistributedStore: kvpool's own
conventions (batch puts give the bytes stored per key, an existing key is -705). The Mooncake
conventions are tested in test_mooncake_api.py."""

import json

import numpy as np
import pytest
import torch

import kvpool

MooncakeDistributedStore = kvpool.Store  # the native store, set up with the same calls


def test_native_store_is_the_base_of_the_mooncake_one():
    assert issubclass(kvpool.MooncakeDistributedStore, kvpool.Store)
    assert kvpool.store.MooncakeDistributedStore is kvpool.MooncakeDistributedStore
    assert kvpool.NO_AVAILABLE_HANDLE == -200


def test_setup_with_the_dict_vllm_passes(pool):
    master = pool.master()
    store = MooncakeDistributedStore()
    # What vLLM's MooncakeStoreWorker builds from MOONCAKE_CONFIG_PATH: sizes as strings.
    ret = store.setup({
        "local_hostname": "127.0.0.1",
        "metadata_server": "P2PHANDSHAKE",
        "global_segment_size": str(0),
        "local_buffer_size": str(4 * 1024**3),
        "protocol": "tcp",
        "rdma_devices": "",
        "master_server_addr": master,
    })
    assert ret == 0
    assert store.put("k", b"hello") == 0
    assert store.get("k") == b"hello"
    assert store.is_exist("k") == 1
    assert store.is_exist("missing") == 0
    assert store.batch_is_exist(["k", "missing"]) == [1, 0]
    assert store.get_size("k") == 5
    assert store.get_size("missing") == kvpool.OBJECT_NOT_FOUND
    assert store.get("missing") == b""
    assert store.put("k", b"other") == kvpool.OBJECT_ALREADY_EXISTS
    # The get above leased the object: removing it takes force while the lease runs.
    assert store.remove("k") == kvpool.OBJECT_HAS_LEASE
    assert store.remove("k", force=True) == 0
    assert store.is_exist("k") == 0
    assert store.remove("k") == kvpool.OBJECT_NOT_FOUND
    assert store.close() == 0
    assert store.is_exist("k") == -1
    assert store.put("k", b"x") != 0


def test_positional_setup_and_file_setup(pool, tmp_path, monkeypatch):
    master = pool.master()
    store = kvpool.Store()
    assert store.setup("127.0.0.1", "P2PHANDSHAKE", 0, 16 << 20, "tcp", "", master) == 0
    assert store.put("a", np.arange(4, dtype=np.int32)) == 0
    assert np.frombuffer(store.get("a"), dtype=np.int32).tolist() == [0, 1, 2, 3]
    with pytest.raises((BufferError, ValueError)):  # not one contiguous range
        store.put("strided", np.arange(8, dtype=np.int32)[::2])
    store.close()

    path = tmp_path / "mooncake_config.json"
    path.write_text(json.dumps({
        "metadata_server": "P2PHANDSHAKE",
        "master_server_address": master,
        "global_segment_size": "0",
        "local_buffer_size": "4GB",
        "protocol": "rdma",
        "device_name": "",
    }))
    monkeypatch.setenv("MOONCAKE_CONFIG_PATH", str(path))
    from_env = kvpool.Store()
    assert from_env.setup_from_file() == 0
    assert from_env.get("a") == np.arange(4, dtype=np.int32).tobytes()
    from_env.close()


def test_setup_refuses_bad_configs(pool):
    master = pool.master()
    store = kvpool.Store()
    assert store.setup({"master_server_address": master, "global_segmnet_size": 1}) != 0
    assert store.setup({"master_server_address": master, "global_segment_size": "4 parsecs"}) != 0
    assert store.setup({"master_server_address": master, "protocol": "carrier-pigeon"}) != 0
    assert store.setup({"global_segment_size": 0}) != 0
    assert not store.is_setup
    with pytest.raises(ValueError):
        store.setup({"master_server_address": [master]})


def test_multi_buffer_batches(pool, open_store):
    store = open_store(pool.master())
    k = torch.arange(64, dtype=torch.float16)
    v = torch.arange(100, 164, dtype=torch.float16)
    other = torch.full((32,), 7, dtype=torch.uint8)
    keys = ["chunk-0", "chunk-1"]
    ptrs = [[k.data_ptr(), v.data_ptr()], [other.data_ptr()]]
    sizes = [[k.numel() * 2, v.numel() * 2], [other.numel()]]
    assert store.register_buffer(k.data_ptr(), k.numel() * 2) == 0
    assert store.register_buffer(k.data_ptr(), k.numel() * 2) == 0  # same range again: fine
    assert store.register_buffer(k.data_ptr() + 2, 8) != 0  # overlaps
    assert store.batch_put_from_multi_buffers(keys, ptrs, sizes) == [256, 32]
    assert store.batch_put_from_multi_buffers(keys, ptrs, sizes) == [kvpool.OBJECT_ALREADY_EXISTS] * 2
    assert store.batch_is_exist(keys + ["nope"]) == [1, 1, 0]

    k2, v2, other2 = torch.zeros_like(k), torch.zeros_like(v), torch.zeros_like(other)
    got = store.batch_get_into_multi_buffers(
        keys + ["nope"],
        [[k2.data_ptr(), v2.data_ptr()], [other2.data_ptr()], [other2.data_ptr()]],
        [[128, 128], [32], [32]])
    assert got == [256, 32, kvpool.OBJECT_NOT_FOUND]
    assert torch.equal(k, k2) and torch.equal(v, v2) and torch.equal(other, other2)

    # Single-buffer forms.
    flat = torch.arange(16, dtype=torch.int64)
    assert store.put_from("flat", flat.data_ptr(), 128) == 0
    back = torch.zeros_like(flat)
    assert store.get_into("flat", back.data_ptr(), 128) == 128
    assert torch.equal(flat, back)
    assert store.batch_get_into(["flat"], [back.data_ptr()], [8]) == [-10]  # BUFFER_OVERFLOW

    # Lists that do not line up are refused per key.
    assert store.batch_put_from_multi_buffers(["x", "y"], [[k.data_ptr()]], [[128]]) == [
        kvpool.INVALID_PARAMS] * 2
    assert store.unregister_buffer(k.data_ptr()) == 0


def test_full_pool_answers_no_available_handle(pool, open_store):
    store = open_store(pool.master(embedded_segment_size="64KiB"))
    data = torch.ones(16 * 1024, dtype=torch.uint8)
    keys = [f"big-{i}" for i in range(8)]
    results = store.batch_put_from_multi_buffers(
        keys, [[data.data_ptr()]] * len(keys), [[data.numel()]] * len(keys))
    assert results.count(16 * 1024) == 4
    assert results.count(kvpool.NO_AVAILABLE_HANDLE) == 4


def test_global_segment_size_mounts_a_segment_in_this_process(pool, open_store):
    master = pool.master(embedded_segment_size="0")  # no memory but ours
    store = open_store(master, global_segment_size="8MB")
    assert store.get_hostname().startswith("127.0.0.1:")
    assert store.cluster_status()["capacity_bytes"] == 8 * 1024 * 1024
    assert store.put("mine", b"x" * 1000) == 0
    assert store.segment_stats()["bytes_written"] == 1000

    reader = open_store(master)
    assert reader.segment_stats() is None
    assert reader.get("mine") == b"x" * 1000

    # Closing the owner unmounts its segment: its objects leave the pool.
    store.close()
    assert reader.is_exist("mine") == 0
    assert reader.cluster_status()["capacity_bytes"] == 0
