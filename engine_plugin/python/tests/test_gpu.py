"""The GPU side from Python, against real pool processes: CUDA KV caches in StoreWorker (every
layout the detector knows), GpuBlockMover, and kvpool.ops against torch reference math (eager,
torch.compile and CUDA graphs). Needs a CUDA GPU and a module built with CUDA; elsewhere every
test here says it was skipped, and why (tests/test_ops.py checks the ops' argument errors
everywhere)."""

import math

import pytest
import torch

import kvpool

pytestmark = pytest.mark.skipif(
    not getattr(kvpool, "HAS_CUDA", False) or not torch.cuda.is_available(),
    reason="no CUDA GPU here (or kvpool built without nvcc): GPU tests skipped",
)

if getattr(kvpool, "HAS_CUDA", False):
    import kvpool.ops as ops

NUM_BLOCKS = 32
BLOCK_SIZE = 16
HEADS = 4
HEAD_DIM = 128
LAYERS = 2


def rand(*shape, dtype=torch.bfloat16, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(*shape, generator=g, device="cuda", dtype=torch.float32).to(dtype)


# --- CUDA caches in StoreWorker -----------------------------------------------------------

# name -> (caches for one worker, how to read block b of layer l as a tensor)
def flash_attention(seed):
    return ([rand(2, NUM_BLOCKS, BLOCK_SIZE, HEADS, HEAD_DIM, seed=seed + l) for l in range(LAYERS)],
            lambda caches, l, b: caches[l][:, b])


def flash_infer(seed):
    return ([rand(NUM_BLOCKS, 2, BLOCK_SIZE, HEADS, HEAD_DIM, seed=seed + l) for l in range(LAYERS)],
            lambda caches, l, b: caches[l][b])


def mla(seed):
    return ([rand(NUM_BLOCKS, BLOCK_SIZE, 576, seed=seed + l) for l in range(LAYERS)],
            lambda caches, l, b: caches[l][b])


def packed(seed):
    return ([rand(NUM_BLOCKS, BLOCK_SIZE, HEADS, 2 * HEAD_DIM, seed=seed + l) for l in range(LAYERS)],
            lambda caches, l, b: caches[l][b])


def cross_layer(seed):
    return (rand(NUM_BLOCKS, LAYERS, 2, BLOCK_SIZE, HEADS, HEAD_DIM, seed=seed),
            lambda cache, l, b: cache[b, l])


LAYOUTS = {"flash_attention": flash_attention, "flash_infer": flash_infer, "mla": mla,
           "packed_kv": packed, "cross_layer": cross_layer}


def step(worker, requests, finished=(), ready_event=None):
    sending, recving = worker.get_finished(set(finished), requests, set(), ready_event)
    worker.wait_idle()
    more_sending, more_recving = worker.get_finished(set(), [])
    return sending | more_sending, recving | more_recving


def register(worker, caches):
    if isinstance(caches, torch.Tensor):
        worker.register_cross_layers_kv_caches(caches, NUM_BLOCKS)
    else:
        worker.register_kv_caches({f"layer.{i}": t for i, t in enumerate(caches)}, NUM_BLOCKS)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_worker_stores_and_loads_cuda_caches(pool, open_store, layout):
    master = pool.master(embedded_segment_size="0")
    pool.segment(master, size="256MiB")
    make = LAYOUTS[layout]
    use_mla = layout == "mla"
    # Producer: blocks 5, 9, 2, 30 of its cache hold a 4-block prompt.
    src, block = make(seed=1)
    producer = kvpool.StoreWorker(open_store(master), "org/gpu-model", num_kv_heads=HEADS,
                                  use_mla=use_mla, block_size=BLOCK_SIZE, kv_role="kv_producer")
    register(producer, src)
    assert producer.on_gpu
    hashes = [f"{layout}/{i}".encode() for i in range(4)]
    src_ids = [5, 9, 2, 30]
    ready = torch.cuda.Event()
    ready.record()
    sending, _ = step(producer, [kvpool.ReqMeta("a", token_len_chunk=4 * BLOCK_SIZE,
                                                block_ids=src_ids, block_hashes=hashes,
                                                can_save=True)], finished={"a"}, ready_event=ready)
    assert sending == {"a"}
    assert producer.sender_stats()["keys_stored"] == 4

    # Consumer: another process's cache (here another worker and store), other block ids.
    dst, _ = make(seed=100)
    dst = dst.zero_() if isinstance(dst, torch.Tensor) else [t.zero_() for t in dst]
    consumer = kvpool.StoreWorker(open_store(master), "org/gpu-model", num_kv_heads=HEADS,
                                  use_mla=use_mla, block_size=BLOCK_SIZE, kv_role="kv_consumer")
    register(consumer, dst)
    assert consumer.lookup(4 * BLOCK_SIZE, hashes) == 4 * BLOCK_SIZE
    dst_ids = [0, 1, 17, 31]
    tokens = 4 * BLOCK_SIZE
    _, recving = step(consumer, [kvpool.ReqMeta(
        "b", token_len_chunk=tokens, block_ids=dst_ids, block_hashes=hashes,
        load_spec=kvpool.LoadSpec(0, tokens, can_load=True))])
    torch.cuda.synchronize()
    assert recving == {"b"}
    assert consumer.take_failed_load_block_ids() == set()
    for l in range(LAYERS):
        for s, d in zip(src_ids, dst_ids):
            assert torch.equal(block(dst, l, d), block(src, l, s)), (layout, l, s, d)
        # Blocks not loaded stay untouched.
        assert not block(dst, l, 3).any()
    producer.close()
    consumer.close()


def test_missing_block_is_reported_for_recompute(pool, open_store):
    store = open_store(pool.master(embedded_segment_size="128MiB"))
    src, _ = flash_attention(seed=3)
    worker = kvpool.StoreWorker(store, "org/gpu-model", num_kv_heads=HEADS, block_size=BLOCK_SIZE)
    register(worker, src)
    hashes = [f"miss/{i}".encode() for i in range(3)]
    step(worker, [kvpool.ReqMeta("s", token_len_chunk=2 * BLOCK_SIZE, block_ids=[0, 1],
                                 block_hashes=hashes[:2], can_save=True)])
    tokens = 3 * BLOCK_SIZE
    step(worker, [kvpool.ReqMeta("l", token_len_chunk=tokens, block_ids=[4, 5, 6],
                                 block_hashes=hashes, load_spec=kvpool.LoadSpec(0, tokens, True))])
    assert worker.take_failed_load_block_ids() == {6}
    assert torch.equal(src[0][:, 4], src[0][:, 0]) and torch.equal(src[1][:, 5], src[1][:, 1])
    worker.close()


def test_mixed_cpu_and_gpu_caches_are_refused(pool, open_store):
    store = open_store(pool.master())
    worker = kvpool.StoreWorker(store, "org/gpu-model", num_kv_heads=HEADS, block_size=BLOCK_SIZE)
    gpu = torch.zeros(2, NUM_BLOCKS, BLOCK_SIZE, HEADS, HEAD_DIM, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(ValueError, match="both the CPU and a CUDA device"):
        worker.register_kv_caches({"l0": gpu, "l1": gpu.cpu()}, NUM_BLOCKS)
    worker.close()


@pytest.mark.parametrize("plan", [{}, dict(first_batch_blocks=3, batch_blocks=5, last_batch_blocks=2,
                                           staged_first_batch_blocks=3),
                                  dict(first_batch_blocks=1, batch_blocks=1, last_batch_blocks=1,
                                       staged_first_batch_blocks=1),
                                  dict(staged_first_batch_blocks=0)],
                         ids=["default", "3-5-2", "one-by-one", "unstaged"])
def test_gpu_cache_round_trips_through_shared_memory(pool, open_store, plan):
    store = open_store(pool.master())
    blocks, block_size = 64, 16
    cache = torch.randn(2, blocks, block_size, 8, 128, dtype=torch.bfloat16, device="cuda")
    original = cache.clone()
    mover = kvpool.GpuBlockMover(store, [cache], blocks, block_size, **plan)
    keys = [f"gpu/{plan.get('batch_blocks', 0)}/{plan.get('staged_first_batch_blocks')}/{i}"
            for i in range(blocks)]
    assert mover.store_blocks(keys, list(range(blocks))) == [0] * blocks
    cache.zero_()
    assert mover.load_blocks(keys, list(range(blocks))) == [0] * blocks
    torch.cuda.synchronize()
    assert torch.equal(cache, original)
    # Key i into block blocks-1-i: every key's bytes land in the block asked for.
    assert mover.load_blocks(keys, list(reversed(range(blocks)))) == [0] * blocks
    torch.cuda.synchronize()
    assert torch.equal(cache, original.flip(1))


def test_store_head_keeps_each_block_with_its_key_when_some_are_stored_already(pool, open_store):
    # A store's first batch (32 here) goes through the pinned buffer and the CPU: with every
    # other key of it in the pool already (not written again), each new key must still get its
    # own block; the batches after it are copied straight into the pool.
    store = open_store(pool.master())
    blocks, block_size = 64, 16
    cache = torch.randn(2, blocks, block_size, 8, 128, dtype=torch.bfloat16, device="cuda")
    original = cache.clone()
    mover = kvpool.GpuBlockMover(store, [cache], blocks, block_size, staged_first_batch_blocks=32)
    keys = [f"head/{i}" for i in range(blocks)]
    early = list(range(0, 20, 2))
    assert mover.store_blocks([keys[i] for i in early], early) == [0] * len(early)
    cache[:, early] += 1  # what these keys would hold if they were written again
    assert mover.store_blocks(keys, list(range(blocks))) == [0] * blocks
    cache.zero_()
    assert mover.load_blocks(keys, list(range(blocks))) == [0] * blocks
    torch.cuda.synchronize()
    assert torch.equal(cache, original)


def test_located_keys_load_from_their_kept_locations(pool, open_store):
    # A lookup (locate) keeps each found key's leased location; the load then copies from it
    # without asking the master, and a location is used once: a second load asks again.
    store = open_store(pool.master())
    blocks, block_size = 40, 16
    cache = rand(2, blocks, block_size, 8, 128, seed=11)
    original = cache.clone()
    mover = kvpool.GpuBlockMover(store, [cache], blocks, block_size, first_batch_blocks=7,
                                 batch_blocks=9)
    keys = [f"kept/{i}" for i in range(blocks // 2)]
    assert mover.store_blocks(keys, list(range(blocks // 2))) == [0] * (blocks // 2)
    assert mover.locate(keys + ["kept/none"]) == [True] * (blocks // 2) + [False]
    ids = list(range(blocks // 2, blocks))
    assert mover.load_blocks(keys, ids) == [0] * (blocks // 2)
    torch.cuda.synchronize()
    assert torch.equal(cache[:, blocks // 2:], original[:, :blocks // 2])
    # Half the keys kept again, the others asked for, in the same batches.
    assert mover.locate(keys[::2]) == [True] * len(keys[::2])
    cache[:, blocks // 2:].zero_()
    assert mover.load_blocks(list(reversed(keys)), ids) == [0] * (blocks // 2)
    torch.cuda.synchronize()
    assert torch.equal(cache[:, blocks // 2:], original[:, :blocks // 2].flip(1))
    assert mover.load_blocks(["kept/none"], [0]) == [kvpool.OBJECT_NOT_FOUND]


@pytest.mark.parametrize("path", ["force_remote", "tcp"])
def test_gpu_cache_round_trips_over_the_network(pool, open_store, path):
    # Pinned staging and the client's transports, as for another machine's pool; tcp: a client
    # that moves every byte over TCP.
    store = open_store(pool.master())
    blocks, block_size = 16, 16
    cache = rand(2, blocks, block_size, 8, 128, seed=7)
    original = cache.clone()
    mover = kvpool.GpuBlockMover(store, [cache], blocks, block_size, **{path: True})
    keys = [f"{path}/{i}" for i in range(blocks)]
    assert mover.store_blocks(keys, list(range(blocks))) == [0] * blocks
    cache.zero_()
    assert mover.load_blocks(keys, list(range(blocks))) == [0] * blocks
    torch.cuda.synchronize()
    assert torch.equal(cache, original)
    assert mover.load_blocks(["tcp/none"], [0]) == [kvpool.OBJECT_NOT_FOUND]


# --- checksums on the GPU -------------------------------------------------------------------

def test_gpu_checksum_equals_libxxhash():
    # The GPU's XXH3-64 against libxxhash's on the CPU: every short length (< 240 bytes, all
    # of XXH3's short paths), around the 1 KiB block and 16 KiB step, MiBs, unaligned starts
    # and tails.
    import random
    g = torch.Generator(device="cuda").manual_seed(5)
    total = 5 << 20
    data = torch.randint(0, 256, (total,), dtype=torch.uint8, device="cuda", generator=g)
    host = data.cpu().numpy().tobytes()
    rng = random.Random(1)
    sizes = list(range(0, 260)) + [1023, 1024, 1025, 2047, 2048, 4096, 16383, 16384, 16385,
                                   65536 + 7, 1 << 20, (2 << 20) + 13, total - 8]
    sizes += [rng.randrange(1, 16 << 10) for _ in range(40)]
    sizes += [rng.randrange(1, total - 8) for _ in range(20)]
    stream = torch.cuda.current_stream().cuda_stream
    for size in sizes:
        off = rng.randrange(0, 8)
        got = kvpool._kvpool._checksum_on_gpu(data.data_ptr() + off, size, stream)
        assert got == kvpool._kvpool._checksum(host[off:off + size]), (size, off)


# name -> tensors of one layer list whose blocks are odd sizes: short objects (84 bytes), long
# ones with unaligned blocks (540 bytes, 4-byte aligned), and several segments whose boundaries
# cut XXH3's 64-byte stripes (4 x 270 bytes).
ODD_CACHES = {
    "short": lambda: [rand(16, 2, 3, 1, 7, seed=1)],
    "unaligned": lambda: [rand(16, 2, 5, 3, 9, seed=2)],
    "straddling": lambda: [rand(2, 64, 5, 3, 9, seed=3 + l) for l in range(2)],
}


@pytest.mark.parametrize("name", sorted(ODD_CACHES))
def test_gpu_checksums_of_odd_block_sizes(pool, open_store, name):
    # Stores commit with the GPU's checksums; the segment's commit check (on by default) and a
    # plain get (checksums verified by default) both hash on the CPU, so a checksum other than
    # libxxhash's would fail the store or the get; the load checks the GPU's hash of what
    # landed.
    store = open_store(pool.master())
    caches = ODD_CACHES[name]()
    blocks = caches[0].shape[1] if caches[0].shape[0] == 2 else caches[0].shape[0]
    block_size = caches[0].shape[2]
    originals = [c.clone() for c in caches]
    mover = kvpool.GpuBlockMover(store, caches, blocks, block_size)
    keys = [f"odd/{name}/{i}" for i in range(8)]
    ids = [0, 3, 5, 6, 9, 10, 14, 15]
    assert mover.store_blocks(keys, ids) == [0] * len(keys)
    for c in caches:
        c.zero_()
    assert mover.load_blocks(keys, ids) == [0] * len(keys)
    torch.cuda.synchronize()
    for c, o in zip(caches, originals):
        for i in ids:
            kv_first = c.shape[0] == 2 and name == "straddling"
            block = (lambda t: t[:, i]) if kv_first else (lambda t: t[i])
            assert torch.equal(block(c), block(o)), (name, i)
    for key in keys:
        assert store.get(key) != b"", key  # the CPU's hash agreed with the GPU's


def test_corrupt_pooled_block_is_reported_never_used(pool, open_store):
    store = open_store(pool.master())
    blocks, block_size = 8, 16
    cache = rand(2, blocks, block_size, 8, 128, seed=11)
    original = cache.clone()
    mover = kvpool.GpuBlockMover(store, [cache], blocks, block_size)
    keys = [f"corrupt/{i}" for i in range(blocks)]
    assert mover.store_blocks(keys, list(range(blocks))) == [0] * blocks
    # One byte of block 3's object (in its V part), after the commit.
    kvpool._kvpool._corrupt_pooled_object(store, keys[3], mover.bytes_per_block - 100)
    cache.zero_()
    codes = mover.load_blocks(keys, list(range(blocks)))
    torch.cuda.synchronize()
    assert codes == [0, 0, 0, -801, 0, 0, 0, 0]  # -801: CHECKSUM_MISMATCH
    for b in range(blocks):
        if b != 3:
            assert torch.equal(cache[:, b], original[:, b]), b


def test_worker_reports_a_corrupt_block_for_recompute(pool, open_store):
    master = pool.master(embedded_segment_size="0")
    pool.segment(master, size="256MiB")
    src, _ = flash_attention(seed=21)
    producer = kvpool.StoreWorker(open_store(master), "org/gpu-model", num_kv_heads=HEADS,
                                  block_size=BLOCK_SIZE, kv_role="kv_producer")
    register(producer, src)
    hashes = [f"corrupt-worker/{i}".encode() for i in range(4)]
    tokens = 4 * BLOCK_SIZE
    step(producer, [kvpool.ReqMeta("a", token_len_chunk=tokens, block_ids=[1, 2, 3, 4],
                                   block_hashes=hashes, can_save=True)], finished={"a"})
    assert producer.sender_stats()["keys_stored"] == 4
    reader = open_store(master)
    kvpool._kvpool._corrupt_pooled_object(reader, producer.token_database.key(hashes[2]), 7)
    dst, _ = flash_attention(seed=22)
    for t in dst:
        t.zero_()
    consumer = kvpool.StoreWorker(reader, "org/gpu-model", num_kv_heads=HEADS,
                                  block_size=BLOCK_SIZE, kv_role="kv_consumer")
    register(consumer, dst)
    step(consumer, [kvpool.ReqMeta("b", token_len_chunk=tokens, block_ids=[10, 11, 12, 13],
                                   block_hashes=hashes,
                                   load_spec=kvpool.LoadSpec(0, tokens, can_load=True))])
    torch.cuda.synchronize()
    assert consumer.take_failed_load_block_ids() == {12}
    for l in range(LAYERS):
        for s, d in ((1, 10), (2, 11), (4, 13)):
            assert torch.equal(dst[l][:, d], src[l][:, s]), (l, s, d)
    producer.close()
    consumer.close()


def test_layerwise_load_with_waits_in_a_cuda_graph(pool, open_store):
    # start_load_kv queues the copies layer by layer; a CUDA graph captured with
    # wait_for_layer_load (before any load) reads each layer only once it landed, at every
    # replay; get_finished reports the load, a corrupt block among the failed ones.
    master = pool.master(embedded_segment_size="0")
    pool.segment(master, size="256MiB")
    src, _ = flash_attention(seed=31)
    producer = kvpool.StoreWorker(open_store(master), "org/gpu-model", num_kv_heads=HEADS,
                                  block_size=BLOCK_SIZE, kv_role="kv_producer")
    register(producer, src)
    hashes = [f"layerwise/{i}".encode() for i in range(6)]
    tokens = 6 * BLOCK_SIZE
    src_ids = [0, 1, 2, 3, 4, 5]
    step(producer, [kvpool.ReqMeta("a", token_len_chunk=tokens, block_ids=src_ids,
                                   block_hashes=hashes, can_save=True)], finished={"a"})
    assert producer.sender_stats()["keys_stored"] == 6
    reader = open_store(master)
    dst, _ = flash_attention(seed=32)
    consumer = kvpool.StoreWorker(reader, "org/gpu-model", num_kv_heads=HEADS,
                                  block_size=BLOCK_SIZE, kv_role="kv_consumer")
    register(consumer, dst)
    dst_ids = [20, 21, 22, 23, 24, 25]
    ids = torch.tensor(dst_ids, device="cuda")
    out = torch.zeros(LAYERS, 2, len(dst_ids), BLOCK_SIZE, HEADS, HEAD_DIM, device="cuda",
                      dtype=torch.bfloat16)
    stream = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        for l in range(LAYERS):  # warm-up outside the capture
            consumer.wait_for_layer_load(l, stream.cuda_stream)
            out[l].copy_(dst[l].index_select(1, ids))
        with torch.cuda.graph(graph, stream=stream):
            for l in range(LAYERS):
                consumer.wait_for_layer_load(l, torch.cuda.current_stream().cuda_stream)
                out[l].copy_(dst[l].index_select(1, ids))
    with pytest.raises(Exception, match="negative"):
        consumer.wait_for_layer_load(-1, stream.cuda_stream)
    for round in range(2):
        for t in dst:
            t.zero_()
        torch.cuda.synchronize()
        if round == 1:  # one byte of block 3's object changed after its commit
            kvpool._kvpool._corrupt_pooled_object(reader, producer.token_database.key(hashes[3]),
                                                  1000)
        req = kvpool.ReqMeta(f"b{round}", token_len_chunk=tokens, block_ids=dst_ids,
                             block_hashes=hashes, load_spec=kvpool.LoadSpec(0, tokens, True))
        consumer.start_load_kv([req])
        with torch.cuda.stream(stream):
            graph.replay()
        stream.synchronize()
        _, recving = consumer.get_finished(set(), [])
        assert recving == {f"b{round}"}
        failed = consumer.take_failed_load_block_ids()
        assert failed == (set() if round == 0 else {23})
        for l in range(LAYERS):
            for k, (s_id, d_id) in enumerate(zip(src_ids, dst_ids)):
                if d_id in failed:
                    continue
                assert torch.equal(out[l][:, k], src[l][:, s_id]), (round, l, s_id)
        assert consumer.receiver_stats()["keys_loaded"] == (6 if round == 0 else 11)
    producer.close()
    consumer.close()


# --- kvpool.ops against torch reference math ---------------------------------------------

def paged_reference(q, k_rows, v_rows, seq_lens, sm_scale):
    """q [B, Hq, D]; k_rows/v_rows(b) -> [T, Hkv, Dk] / [T, Hkv, Dv] float64."""
    out = []
    for b in range(q.shape[0]):
        k, v = k_rows(b), v_rows(b)
        group = q.shape[1] // k.shape[1]
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
        s = torch.einsum("hd,thd->ht", q[b].double(), k) * sm_scale
        out.append(torch.einsum("ht,thd->hd", torch.softmax(s, dim=-1), v))
    return torch.stack(out)


def rel_err(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def tables(batch, max_blocks, num_blocks, seq_lens, seed):
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(num_blocks, generator=g)[: batch * max_blocks]
    bt = perm.view(batch, max_blocks).to(torch.int32).cuda()
    return bt, torch.tensor(seq_lens, dtype=torch.int32, device="cuda")


@pytest.mark.parametrize("layout", ["kv_first", "blocks_first", "packed", "kv_first_hnd"])
def test_gqa_decode_matches_torch(layout):
    batch, qo, kvh, d, bs, nb = 3, 32, 8, 128, 16, 320
    seq_lens = [1, 700, 1500]
    max_blocks = 96
    q = rand(batch, qo, d, seed=11)
    if layout == "kv_first":
        cache = rand(2, nb, bs, kvh, d, seed=12)
        k_of = lambda blk: cache[0, blk]  # noqa: E731  [BS, H, D]
        v_of = lambda blk: cache[1, blk]  # noqa: E731
        kw = {}
    elif layout == "kv_first_hnd":
        cache = rand(2, nb, kvh, bs, d, seed=12)
        k_of = lambda blk: cache[0, blk].transpose(0, 1)  # noqa: E731
        v_of = lambda blk: cache[1, blk].transpose(0, 1)  # noqa: E731
        kw = {"kv_layout": "HND"}
    elif layout == "blocks_first":
        cache = rand(nb, 2, bs, kvh, d, seed=12)
        k_of = lambda blk: cache[blk, 0]  # noqa: E731
        v_of = lambda blk: cache[blk, 1]  # noqa: E731
        kw = {}
    else:
        cache = rand(nb, bs, kvh, 2 * d, seed=12)
        k_of = lambda blk: cache[blk, :, :, :d]  # noqa: E731
        v_of = lambda blk: cache[blk, :, :, d:]  # noqa: E731
        kw = {}
    bt, sl = tables(batch, max_blocks, nb, seq_lens, seed=13)

    def rows(of):
        def f(b):
            n = seq_lens[b]
            blocks = [of(int(bt[b, i])) for i in range((n + bs - 1) // bs)]
            return torch.cat(blocks)[:n].double()
        return f

    scale = 1 / math.sqrt(d)
    o, lse = ops.gqa_decode(q, cache, bt, sl, return_lse=True, **kw)
    torch.cuda.synchronize()
    ref = paged_reference(q, rows(k_of), rows(v_of), seq_lens, scale)
    assert o.shape == (batch, qo, d) and o.dtype == torch.bfloat16
    assert not torch.isnan(o).any()
    assert rel_err(o, ref) < 1e-2
    assert lse.shape == (batch, qo)


def test_mla_decode_matches_torch():
    batch, heads, bs, nb = 2, 16, 64, 64
    seq_lens = [100, 1000]
    max_blocks = 16
    q = rand(batch, heads, 576, seed=21)
    cache = rand(nb, bs, 576, seed=22)
    bt, sl = tables(batch, max_blocks, nb, seq_lens, seed=23)

    def rows(dim):
        def f(b):
            n = seq_lens[b]
            blocks = [cache[int(bt[b, i])] for i in range((n + bs - 1) // bs)]
            return torch.cat(blocks)[:n, None, :dim].double()
        return f

    scale = 1 / math.sqrt(576)
    o = ops.mla_decode(q, cache, bt, sl, sm_scale=scale)
    torch.cuda.synchronize()
    ref = paged_reference(q, rows(576), rows(512), seq_lens, scale)
    assert o.shape == (batch, heads, 512)
    assert rel_err(o, ref) < 1e-2


def test_copy_blocks_round_trip_in_pool_format():
    caches = [rand(2, NUM_BLOCKS, BLOCK_SIZE, HEADS, HEAD_DIM, seed=31 + l) for l in range(2)]
    layout = kvpool.detect_layout(caches, NUM_BLOCKS, BLOCK_SIZE)
    ids = torch.tensor([3, 7, 0], dtype=torch.int32)
    blocks = torch.empty(3, layout.bytes_per_block, dtype=torch.uint8).pin_memory()
    ops.copy_blocks(caches, blocks, ids, NUM_BLOCKS, BLOCK_SIZE)
    torch.cuda.synchronize()
    # Row i: layer 0 K, layer 0 V, layer 1 K, layer 1 V of block ids[i], as the pool stores it.
    for i, b in enumerate(ids.tolist()):
        expected = torch.cat([caches[l][kv, b].flatten().view(torch.uint8).cpu()
                              for l in range(2) for kv in range(2)])
        assert torch.equal(blocks[i], expected)
    for t in caches:
        t.zero_()
    ops.copy_blocks(caches, blocks, ids, NUM_BLOCKS, BLOCK_SIZE, to_cache=True)
    torch.cuda.synchronize()
    for i, b in enumerate(ids.tolist()):
        assert torch.equal(torch.cat([caches[l][kv, b].flatten().view(torch.uint8).cpu()
                                      for l in range(2) for kv in range(2)]), blocks[i])


def test_gqa_decode_under_torch_compile_and_cuda_graphs():
    batch, qo, kvh, d, bs, nb = 4, 32, 8, 128, 16, 128
    q = rand(batch, qo, d, seed=41)
    cache = rand(2, nb, bs, kvh, d, seed=42)
    bt, sl = tables(batch, 32, nb, [300, 17, 512, 99], seed=43)
    eager = ops.gqa_decode(q, cache, bt, sl)

    if hasattr(torch, "compile"):
        compiled = torch.compile(lambda q: ops.gqa_decode(q, cache, bt, sl) * 2.0, fullgraph=True)
        assert torch.equal(compiled(q), eager * 2.0)

    static_q = q.clone()
    ops.gqa_decode(static_q, cache, bt, sl)  # warm-up: plans outside the capture
    graph = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        ops.gqa_decode(static_q, cache, bt, sl)
        with torch.cuda.graph(graph, stream=s):
            static_o = ops.gqa_decode(static_q, cache, bt, sl)
    torch.cuda.current_stream().wait_stream(s)
    q2 = rand(batch, qo, d, seed=44)
    static_q.copy_(q2)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(static_o, ops.gqa_decode(q2, cache, bt, sl))


# --- Mooncake's raw-pointer calls on GPU memory ---------------------------------------------
# Engines written for mooncake.store (the seed's MooncakeStoreConnector) register their GPU KV
# cache with register_buffer and pass block addresses to batch_put_from_multi_buffers /
# batch_get_into_multi_buffers; Mooncake's own test_cuda_local_copy_paths calls get_into on a
# CUDA tensor. These run those calls, unchanged, on CUDA memory.


@pytest.fixture
def mooncake_store(pool):
    from kvpool.store import MooncakeDistributedStore

    master = pool.master(embedded_segment_size="512MiB")
    store = MooncakeDistributedStore()
    assert store.setup("127.0.0.1", "P2PHANDSHAKE", 0, 16 << 20, "tcp", "", master) == 0
    yield store
    store.close()


def layer_caches(layers, blocks, block_bytes, seed):
    """One uint8 CUDA tensor [blocks, block_bytes] per layer, random bytes."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    return [torch.randint(0, 256, (blocks, block_bytes), dtype=torch.uint8, device="cuda",
                          generator=g) for _ in range(layers)]


def block_addrs(caches, block):
    return [c[block].data_ptr() for c in caches], [c[block].numel() for c in caches]


@pytest.mark.parametrize("register", [True, False], ids=["registered", "unregistered"])
def test_mooncake_multi_buffer_calls_move_gpu_cache_blocks(mooncake_store, register):
    """The connector's pattern: one key per block, one buffer per layer; stored from one GPU
    cache, loaded into other blocks of another, byte for byte."""
    layers, blocks, block_bytes = 4, 64, 32 << 10
    src = layer_caches(layers, blocks, block_bytes, seed=1)
    dst = [torch.zeros_like(c) for c in src]
    if register:
        for c in src + dst:
            assert mooncake_store.register_buffer(c.data_ptr(), c.numel()) == 0
    torch.cuda.synchronize()
    keys = [f"gpu-block-{register}-{b}" for b in range(blocks)]
    addrs, sizes = zip(*(block_addrs(src, b) for b in range(blocks)))
    # Mooncake's convention: 0 per key stored.
    assert mooncake_store.batch_put_from_multi_buffers(keys, list(addrs), list(sizes)) == [
        0] * blocks
    # Loaded into the blocks in reverse order, with one key absent.
    order = list(reversed(range(blocks)))
    get_keys = keys[:-1] + ["never-stored"]
    addrs, sizes = zip(*(block_addrs(dst, b) for b in order))
    got = mooncake_store.batch_get_into_multi_buffers(get_keys, list(addrs), list(sizes))
    assert got[:-1] == [layers * block_bytes] * (blocks - 1)
    assert got[-1] == kvpool.OBJECT_NOT_FOUND
    for s, d in zip(src, dst):
        assert torch.equal(d[order[:-1]], s[: blocks - 1])
        assert not d[order[-1]].any()  # the absent key's blocks untouched


def test_mooncake_single_calls_on_cuda_tensors(mooncake_store):
    """Mooncake's test_cuda_local_copy_paths and the other single-key forms."""
    raw = bytes(range(256)) * 4
    assert mooncake_store.put("raw", raw) == 0
    dst = torch.empty(len(raw), dtype=torch.uint8, device="cuda")
    assert mooncake_store.get_into("raw", dst.data_ptr(), len(raw)) == len(raw)
    assert torch.equal(dst.cpu(), torch.frombuffer(bytearray(raw), dtype=torch.uint8))
    src = torch.arange(4096, dtype=torch.int32, device="cuda")
    torch.cuda.synchronize()
    assert mooncake_store.put_from("from-gpu", src.data_ptr(), src.numel() * 4) == 0
    assert mooncake_store.get("from-gpu") == src.cpu().numpy().tobytes()
    # batch_put_from / batch_get_into, CPU and GPU buffers mixed in one call.
    cpu = torch.arange(1024, dtype=torch.uint8)
    assert mooncake_store.batch_put_from(["mixed-gpu", "mixed-cpu"],
                                         [src.data_ptr(), cpu.data_ptr()],
                                         [src.numel() * 4, cpu.numel()]) == [0, 0]
    out_gpu = torch.zeros_like(src)
    out_cpu = torch.zeros_like(cpu)
    assert mooncake_store.batch_get_into(["mixed-gpu", "mixed-cpu"],
                                         [out_gpu.data_ptr(), out_cpu.data_ptr()],
                                         [src.numel() * 4, cpu.numel()]) == [src.numel() * 4,
                                                                            cpu.numel()]
    assert torch.equal(out_gpu, src) and torch.equal(out_cpu, cpu)


def test_mooncake_range_reads_and_tensor_buffers_on_gpu(mooncake_store):
    value = bytes(range(200))
    assert mooncake_store.put("ranges", value) == 0
    dst = torch.zeros(64, dtype=torch.uint8, device="cuda")
    got = mooncake_store.get_into_ranges([dst.data_ptr()], [["ranges"]], [[[0, 32]]],
                                         [[[10, 100]]], [[[16, 8]]])
    assert got == [[[16, 8]]]
    expected = torch.zeros(64, dtype=torch.uint8)
    expected[0:16] = torch.arange(10, 26, dtype=torch.uint8)
    expected[32:40] = torch.arange(100, 108, dtype=torch.uint8)
    assert torch.equal(dst.cpu(), expected)
    # A stored tensor object read into a CUDA buffer comes back as a CUDA tensor over it.
    t = torch.randn(8, 16, device="cuda")
    assert mooncake_store.put_tensor("tensor", t) == 0
    size = mooncake_store.get_size("tensor")
    buf = torch.zeros(size, dtype=torch.uint8, device="cuda")
    out = mooncake_store.get_tensor_into("tensor", buf.data_ptr(), size)
    assert out is not None and out.is_cuda and torch.equal(out, t)
    # ... and stored again from there (put_tensor_from reads its header on the GPU).
    assert mooncake_store.put_tensor_from("tensor-again", buf.data_ptr(), size) == 0
    assert torch.equal(mooncake_store.get_tensor("tensor-again"), t.cpu())


def test_mooncake_gpu_parts_are_checked_against_their_allocation(mooncake_store):
    """A part running past the end of its CUDA allocation fails its key (nothing read past
    it); the other keys of the call are stored."""
    t = torch.ones(4096, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    base = t.untyped_storage().data_ptr()
    codes = mooncake_store.batch_put_from(["ok", "too-long"], [t.data_ptr(), base],
                                          [4096, 1 << 40])
    assert codes[0] == 0
    assert codes[1] == kvpool.INVALID_PARAMS
    assert mooncake_store.is_exist("too-long") == 0


def test_mooncake_gpu_batch_larger_than_the_staging_window(mooncake_store):
    """256 MiB in one call: moved in windows of 128 MiB of pinned memory, in order."""
    layers, blocks, block_bytes = 2, 64, 2 << 20
    src = layer_caches(layers, blocks, block_bytes, seed=2)
    dst = [torch.zeros_like(c) for c in src]
    torch.cuda.synchronize()
    keys = [f"big-{b}" for b in range(blocks)]
    addrs, sizes = zip(*(block_addrs(src, b) for b in range(blocks)))
    assert mooncake_store.batch_put_from_multi_buffers(keys, list(addrs), list(sizes)) == [
        0] * blocks
    addrs, sizes = zip(*(block_addrs(dst, b) for b in range(blocks)))
    assert mooncake_store.batch_get_into_multi_buffers(keys, list(addrs), list(sizes)) == [
        layers * block_bytes] * blocks
    for s, d in zip(src, dst):
        assert torch.equal(s, d)
