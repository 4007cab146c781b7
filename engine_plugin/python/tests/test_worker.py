"""StoreWorker over real pool processes: round trips of a CPU torch KV cache, dedup, lookup
across ranks, the pressure back-off, and the ready event."""

import threading
import time

import pytest
import torch

import kvpool

NUM_BLOCKS = 16
BLOCK_SIZE = 16
HEADS = 2
HEAD_DIM = 32


def make_cache(seed):
    """One FlashAttention-layout layer, (2, blocks, block_size, heads, head_dim), random."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(2, NUM_BLOCKS, BLOCK_SIZE, HEADS, HEAD_DIM, generator=g,
                       dtype=torch.float32).to(torch.bfloat16)


def hashes(prefix, n):
    return [f"{prefix}/{i}".encode() for i in range(n)]


def save(req_id, block_hashes, block_ids):
    return kvpool.ReqMeta(req_id, token_len_chunk=len(block_hashes) * BLOCK_SIZE,
                          block_ids=block_ids, block_hashes=block_hashes, can_save=True)


def load(req_id, block_hashes, block_ids, engine_cached=0):
    tokens = len(block_hashes) * BLOCK_SIZE
    return kvpool.ReqMeta(req_id, token_len_chunk=tokens, block_ids=block_ids,
                          block_hashes=block_hashes,
                          load_spec=kvpool.LoadSpec(engine_cached, tokens, can_load=True))


def step(worker, requests, finished=(), preempted=(), ready_event=None):
    """One scheduler step; waits for the threads and returns everything reported done."""
    sending, recving = worker.get_finished(set(finished), requests, set(preempted), ready_event)
    worker.wait_idle()
    more_sending, more_recving = worker.get_finished(set(), [])
    return sending | more_sending, recving | more_recving


def make_worker(store, caches, **options):
    options.setdefault("num_kv_heads", HEADS)
    worker = kvpool.StoreWorker(store, "org/integration-model", block_size=BLOCK_SIZE, **options)
    worker.register_kv_caches(caches, NUM_BLOCKS)
    return worker


def test_store_zero_load_restores_identical_bytes(pool, open_store):
    master = pool.master(embedded_segment_size="0")
    pool.segment(master)
    store = open_store(master)
    caches = {"layer.0": make_cache(0), "layer.1": make_cache(1)}
    original = {name: t.clone() for name, t in caches.items()}
    worker = make_worker(store, caches)
    assert len(store.registered_buffers()) == 2
    assert worker.layout.block_len == [BLOCK_SIZE * HEADS * HEAD_DIM * 2] * 4

    h = hashes("prompt", 5)
    blocks = [9, 3, 12, 15, 0]
    sending, _ = step(worker, [save("req-a", h, blocks)], finished={"req-a"})
    assert sending == {"req-a"}
    assert worker.sender_stats()["keys_stored"] == 5
    assert worker.lookup(5 * BLOCK_SIZE, h) == 5 * BLOCK_SIZE

    for t in caches.values():
        t.zero_()
    _, recving = step(worker, [load("req-b", h, blocks)])
    assert recving == {"req-b"}
    assert worker.take_failed_load_block_ids() == set()
    for name, t in caches.items():
        for kv in range(2):
            for b in range(NUM_BLOCKS):
                expected = original[name][kv, b] if b in blocks else torch.zeros_like(t[kv, b])
                assert torch.equal(t[kv, b], expected), (name, kv, b)
    worker.close()


def test_load_skips_blocks_the_engine_has(pool, open_store):
    store = open_store(pool.master())
    cache = make_cache(2)
    original = cache.clone()
    worker = make_worker(store, [cache])
    h = hashes("prefix", 3)
    step(worker, [save("s", h, [0, 1, 2])])
    cache.zero_()
    # The engine has the first block already (and 5 more tokens): only blocks 1 and 2 load.
    step(worker, [load("l", h, [0, 1, 2], engine_cached=BLOCK_SIZE + 5)])
    assert torch.equal(cache[:, 0], torch.zeros_like(cache[:, 0]))
    assert torch.equal(cache[:, 1:3], original[:, 1:3])
    assert worker.receiver_stats()["keys_loaded"] == 2


def test_second_store_of_the_same_chunks_sends_no_bytes(pool, open_store):
    master = pool.master(embedded_segment_size="0")
    store = open_store(master, global_segment_size="16MB")  # every byte lands in this process
    cache = make_cache(3)
    worker = make_worker(store, [cache])
    chunk_bytes = worker.layout.bytes_per_block
    h = hashes("dedup", 4)

    step(worker, [save("first", h, [0, 1, 2, 3])], finished={"first"})
    assert store.segment_stats()["bytes_written"] == 4 * chunk_bytes
    before = store.cluster_status()

    sending, _ = step(worker, [save("second", h, [4, 5, 6, 7])], finished={"second"})
    assert sending == {"second"}
    assert store.segment_stats()["bytes_written"] == 4 * chunk_bytes
    stats = worker.sender_stats()
    assert stats["keys_present"] == 4 and stats["batches"] == 1
    after = store.cluster_status()
    assert (after["objects"], after["used_bytes"]) == (before["objects"], before["used_bytes"])


def test_lookup_across_tp_and_pp_ranks(pool, open_store):
    master = pool.master()
    # tp_size 2 x pp_size 2: four workers, each with its own store connection and cache.
    workers = {}
    for pp in range(2):
        for tp in range(2):
            workers[(tp, pp)] = make_worker(open_store(master), [make_cache(10 + 2 * pp + tp)],
                                            tp_rank=tp, tp_size=2, pp_rank=pp, pp_size=2)
    h = hashes("shared", 6)
    blocks = list(range(6))
    for (tp, pp), worker in workers.items():
        if (tp, pp) != (1, 1):
            step(worker, [save("r", h, blocks)])
    # Rank (1, 1) has stored nothing yet: no prefix is usable anywhere.
    assert workers[(0, 0)].lookup(6 * BLOCK_SIZE, h) == 0
    step(workers[(1, 1)], [save("r", h[:4], blocks)])
    for worker in workers.values():
        assert worker.lookup(6 * BLOCK_SIZE, h) == 4 * BLOCK_SIZE
    step(workers[(1, 1)], [save("r2", h, blocks)])
    assert workers[(0, 0)].lookup(6 * BLOCK_SIZE, h) == 6 * BLOCK_SIZE
    assert workers[(0, 0)].lookup(5 * BLOCK_SIZE + 7, h) == 5 * BLOCK_SIZE + 7


def test_pressure_back_off_against_a_full_pool(pool, open_store):
    # 64 KiB of pool; a chunk is 2 * 16 * 2 * 32 * 2 = 4 KiB: 16 chunks fill it.
    store = open_store(pool.master(embedded_segment_size="64KiB"))
    worker = make_worker(store, [make_cache(4)])
    blocks = list(range(NUM_BLOCKS))
    # Twelve objects a reader holds leases on: eviction may not take them.
    leased = [f"leased/{i}" for i in range(12)]
    for key in leased:
        assert store.put(key, b"x" * 4096) == 0
    assert store.batch_is_exist(leased) == [1] * 12
    step(worker, [save("big", hashes("b", 12), blocks)])  # 4 fit, 8 find no room
    assert worker.store_pressure_active
    batches = worker.sender_stats()["batches"]

    step(worker, [save("big", hashes("c", 2), blocks)])  # skipped
    assert worker.sender_stats()["batches"] == batches
    assert worker.sender_stats()["skipped_for_pressure"] == 1

    assert store.remove_all(force=True) > 0
    step(worker, [save("small", hashes("d", 2), blocks)])  # succeeds: pressure cleared
    assert not worker.store_pressure_active
    step(worker, [save("big", hashes("e", 2), blocks)])  # resumes
    assert worker.sender_stats()["batches"] == batches + 2


def test_stores_wait_for_the_ready_event(pool, open_store):
    store = open_store(pool.master())
    worker = make_worker(store, [make_cache(5)])
    ready = threading.Event()  # stands in for a recorded torch.cuda.Event
    sending, _ = worker.get_finished({"r"}, [save("r", hashes("ev", 2), [0, 1])], set(), ready)
    assert sending == set()
    time.sleep(0.1)
    assert worker.sender_stats()["batches"] == 0
    ready.set()
    worker.wait_idle()
    sending, _ = worker.get_finished(set(), [])
    assert sending == {"r"}
    assert worker.sender_stats()["keys_stored"] == 2


def test_worker_options_and_refusals(pool, open_store):
    store = open_store(pool.master())
    worker = kvpool.StoreWorker(store, "m", tp_rank=3, tp_size=4, num_kv_heads=2,
                                block_size=BLOCK_SIZE)
    assert worker.put_step == 2
    assert worker.token_database.key(b"\x01") == "m@tp_rank:1@pcp0@dcp0@pp_rank:0@01"
    with pytest.raises(ValueError, match="tp_rank 4"):
        kvpool.StoreWorker(store, "m", tp_rank=4, tp_size=4)
    with pytest.raises(ValueError, match="kv_role"):
        kvpool.StoreWorker(store, "m", kv_role="kv_sometimes")
    with pytest.raises(ValueError, match="KV cache tensor #0 is on a meta device"):
        worker.register_kv_caches([torch.zeros(NUM_BLOCKS, 64, device="meta")], NUM_BLOCKS)
    with pytest.raises(RuntimeError, match="no KV cache is registered"):
        worker.get_finished(set(), [])
    with pytest.raises(RuntimeError, match="not set up"):
        kvpool.StoreWorker(kvpool.Store(), "m")
