"""Mooncake's copy and move tasks (create_copy_task, create_move_task, query_task) against a real
kvpool-master and three kvpool-segment processes: the bytes on every new replica, which segments
hold the object afterwards (each read back with the others unmounted), and the refusals, which
leave the object as it was."""

import concurrent.futures as cf
import os
import time

import pytest

import kvpool
from kvpool.store import (MooncakeDistributedStore, QueryTaskResponse, ReplicateConfig,
                          StoreNotSetUpError, TaskStatus, TaskType)

INVALID_PARAMS = kvpool.INVALID_PARAMS
NOT_FOUND = kvpool.OBJECT_NOT_FOUND


def wait_task(store, task_id, timeout=60.0):
    deadline = time.monotonic() + timeout
    while True:
        resp, err = store.query_task(task_id)
        assert err == 0
        assert isinstance(resp, QueryTaskResponse)
        if resp.status in (TaskStatus.SUCCESS, TaskStatus.FAILED):
            return resp
        assert time.monotonic() < deadline, f"task {task_id} still {resp.status!r}"
        time.sleep(0.02)


def segments_of(store, key):
    return sorted(d.get_memory_descriptor().buffer_descriptor.transport_endpoint
                  for d in store.get_replica_desc(key))


def on(segment, replicas=1):
    config = ReplicateConfig()
    config.replica_num = replicas
    config.preferred_segment = segment
    return config


class Pool3:
    def __init__(self, pool, sizes=("16MiB", "16MiB", "4MiB")):
        self.master = pool.master(embedded_segment_size="0")
        self.names, self.procs = [], []
        for size in sizes:
            self.names.append(pool.segment(self.master, size))
            self.procs.append(pool.processes[-1])
        self.store = MooncakeDistributedStore()
        assert self.store.setup("localhost", "P2PHANDSHAKE", 0, 16 << 20, "tcp", "",
                                self.master) == 0

    def unmount(self, name):
        """Stops the segment process (it unmounts: its replicas leave the index)."""
        self.procs[self.names.index(name)].stop()

    def read_fresh(self, key):
        """key's value as a new client reads it: from the master's answer, through no cached
        location or mapping of a segment that is gone."""
        store = MooncakeDistributedStore()
        assert store.setup("localhost", "P2PHANDSHAKE", 0, 16 << 20, "tcp", "",
                           self.master) == 0
        try:
            return store.get(key)
        finally:
            store.close()


@pytest.fixture
def three(pool):
    p = Pool3(pool)
    yield p
    p.store.close()


def test_copy_task_puts_the_same_bytes_on_each_named_segment(three):
    store, (a, b, c) = three.store, three.names
    payload = os.urandom(2 << 20)
    assert store.put("k", payload, on(a)) == 0
    assert segments_of(store, "k") == [a]

    task_id, err = store.create_copy_task("k", [b, c])
    assert err == 0
    assert isinstance(task_id, tuple) and len(task_id) == 2 and task_id != (0, 0)
    resp = wait_task(store, task_id)
    assert resp.status == TaskStatus.SUCCESS, resp.message
    assert resp.id == task_id and resp.type == TaskType.REPLICA_COPY
    assert resp.error_code == 0
    assert resp.created_at_ms_epoch <= resp.last_updated_at_ms_epoch
    assert segments_of(store, "k") == sorted([a, b, c])
    descs = store.get_replica_desc("k")
    assert {d.get_memory_descriptor().buffer_descriptor.size for d in descs} == {2 << 20}

    # Again to a segment that holds it: success, no second replica there.
    task_id, err = store.create_copy_task("k", [b])
    assert err == 0 and wait_task(store, task_id).status == TaskStatus.SUCCESS
    assert segments_of(store, "k") == sorted([a, b, c])

    # Every replica holds the bytes: read with the others gone, one segment at a time.
    three.unmount(a)
    assert segments_of(store, "k") == sorted([b, c])
    assert three.read_fresh("k") == payload
    three.unmount(b)
    assert segments_of(store, "k") == [c]
    assert three.read_fresh("k") == payload


def test_move_task_leaves_the_object_only_on_the_target(three):
    store, (a, b, c) = three.store, three.names
    payload = os.urandom(1 << 20)
    assert store.put("m", payload, on(a)) == 0
    task_id, err = store.create_move_task("m", a, b)
    assert err == 0
    resp = wait_task(store, task_id)
    assert resp.status == TaskStatus.SUCCESS, resp.message
    assert resp.type == TaskType.REPLICA_MOVE
    assert segments_of(store, "m") == [b]
    # The source's space is given back (once it has forgotten the replica).
    deadline = time.monotonic() + 10
    while store.cluster_status()["used_bytes"] != len(payload):
        assert time.monotonic() < deadline, store.cluster_status()
        time.sleep(0.05)
    # The bytes are the target's: with it gone, nothing is left.
    assert three.read_fresh("m") == payload
    three.unmount(b)
    assert store.is_exist("m") == 0
    assert three.read_fresh("m") == b""


def test_tasks_are_refused_with_mooncakes_codes_and_leave_the_object_intact(three):
    store, (a, b, c) = three.store, three.names
    payload = os.urandom(1 << 20)
    assert store.put("x", payload, on(a)) == 0
    refused = [
        store.create_copy_task("absent", [b]),
        store.create_move_task("absent", a, b),
        store.create_copy_task("x", []),
        store.create_copy_task("x", [b, "unknown_segment"]),
        store.create_move_task("x", "unknown_source", b),
        store.create_move_task("x", a, "unknown_target"),
        store.create_move_task("x", a, a),
        store.create_move_task("x", c, b),  # c holds no replica of x
        store.create_move_task("x", "", b),
    ]
    assert [err for _, err in refused] == [NOT_FOUND, NOT_FOUND] + [INVALID_PARAMS] * 7
    assert all(task_id == (0, 0) for task_id, _ in refused)
    assert store.query_task((1, 2)) == (None, -1400)
    assert segments_of(store, "x") == [a]

    # A target without room: the task fails with NO_AVAILABLE_HANDLE, the object stays.
    pinned = on(c)
    pinned.with_hard_pin = True
    assert store.put("filler", b"f" * (3584 << 10), pinned) == 0
    assert segments_of(store, "filler") == [c]
    for task_id, err in (store.create_copy_task("x", [c]), store.create_move_task("x", a, c)):
        assert err == 0
        resp = wait_task(store, task_id)
        assert resp.status == TaskStatus.FAILED
        assert resp.error_code == kvpool.NO_AVAILABLE_HANDLE
        assert "NO_AVAILABLE_HANDLE" in resp.message
    assert segments_of(store, "x") == [a]
    assert store.get("x") == payload

    closed = MooncakeDistributedStore()
    with pytest.raises(StoreNotSetUpError):
        closed.create_copy_task("x", [b])
    with pytest.raises(StoreNotSetUpError):
        closed.query_task((1, 1))


def test_concurrent_tasks_on_many_keys(three):
    store, names = three.store, three.names
    keys = {f"key{i}": names[i % 3] for i in range(24)}
    values = {key: os.urandom(4096) for key in keys}
    for key, segment in keys.items():
        assert store.put(key, values[key], on(segment)) == 0
    with cf.ThreadPoolExecutor(max_workers=8) as pool:
        created = {}
        for i, (key, segment) in enumerate(keys.items()):
            others = [n for n in names if n != segment]
            if i % 2:
                created[key] = (pool.submit(store.create_move_task, key, segment, others[0]),
                                [others[0]])
            else:
                created[key] = (pool.submit(store.create_copy_task, key, others), names)
        results = {}
        for key, (future, expected) in created.items():
            task_id, err = future.result()
            assert err == 0
            results[key] = (task_id, expected)
    for key, (task_id, expected) in results.items():
        resp = wait_task(store, task_id)
        assert resp.status == TaskStatus.SUCCESS, (key, resp.message)
        assert segments_of(store, key) == sorted(expected), key
        assert store.get(key) == values[key]
