#!/usr/bin/env python3
"""GPU benchmarks of kvpool from Python, side by side in one run (run_on_gpu.sh calls it):

1. bandwidth: a GPU KV cache stored into and loaded from a same-host pool (kvpool-segment on
   loopback, shared memory) through kvpool.GpuBlockMover and through StoreWorker, against a
   pinned 1 GiB host<->device copy, each way and both at once;
2. ops: kvpool.ops.gqa_decode / mla_decode per call (eager, and CUDA-graph replay) against the
   C++ launcher timed in C++ (the same plan, no Python between launches);
3. ttft: a Llama-3.1-8B-shaped model with random weights (transformers LlamaConfig, fixed
   seed; --layers for fewer), time to first token with recompute (prefill through
   transformers, SDPA, bf16) against a pool hit: process-B-style StoreWorker on its own store
   and cache, lookup, load the prefix's blocks, then the last prompt token and N decode tokens
   through kvpool.ops.gqa_decode over the paged cache; greedy tokens and logits are compared
   with transformers decoding the whole prompt itself. Also over TCP (GpuBlockMover with
   tcp=True: pinned staging and a client that uses the TCP transport only). Recompute, the
   pool hits and the load alone are the median of --ttft-reps timed runs (after a warm-up);
   the TCP row is one run;
4. mla: a DeepSeek-shaped latent cache (61 layers x (blocks, 64, 576)) stored and loaded
   through StoreWorker(use_mla=True), then kvpool.ops.mla_decode over the loaded cache against
   torch reference math;
5. mooncake: the seed connector's calls through kvpool's Mooncake API, unchanged, on a GPU
   cache (batch_put_from_multi_buffers / batch_get_into_multi_buffers of registered block
   addresses, staged through pinned memory) against a pinned copy of the same bytes.

Writes bench.json and bench.md into --out and prints the tables.
"""

import argparse
import json
import math
import os
import statistics
import sys
import time
import urllib.request

import torch

import kvpool
import kvpool.ops as ops

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from conftest import Pool  # noqa: E402  (real kvpool-master / kvpool-segment processes)

GiB = 1 << 30
results = {}
lines = []


def say(line=""):
    print(line, flush=True)
    lines.append(line)


def timed(fn, reps=5, warmup=1):
    """Median wall seconds of fn() (which must synchronize itself)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


STORE_PHASES = ("master_ms", "launch_ms", "wait_ms", "commit_ms", "total_ms", "to_first_copy_ms",
                "after_last_copy_ms")
LOAD_PHASES = ("master_ms", "launch_ms", "wait_ms", "total_ms", "to_first_copy_ms")


def timed_phases(mover, direction, fn, reps, phases):
    """timed(fn) and the mover's phase times (ms) per call of `direction` meanwhile."""
    before = mover.phase_times()[direction]
    t = timed(fn, reps=reps)
    after = mover.phase_times()[direction]
    calls = max(1, after["calls"] - before["calls"])
    return t, {k: (after[k] - before[k]) / calls for k in phases}


def master_calls(http, method):
    """How many `method` calls the master has received (its /metrics)."""
    text = urllib.request.urlopen(f"http://{http}/metrics", timeout=5).read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("kvpool_rpc_requests_total{") and f'method="{method}"' in line)


def open_store(master):
    store = kvpool.Store()
    assert store.setup({"master_server_address": master, "global_segment_size": 0,
                        "local_buffer_size": 0, "protocol": "tcp",
                        "local_hostname": "127.0.0.1"}) == 0
    return store


# --- 1. bandwidth ------------------------------------------------------------------------

def pinned_copy(nbytes):
    host = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
    host2 = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
    dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dev2 = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    host.random_(0, 255)
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()

    def h2d():
        dev.copy_(host, non_blocking=True)
        torch.cuda.synchronize()

    def d2h():
        host.copy_(dev, non_blocking=True)
        torch.cuda.synchronize()

    def both():
        with torch.cuda.stream(s1):
            dev.copy_(host, non_blocking=True)
        with torch.cuda.stream(s2):
            host2.copy_(dev2, non_blocking=True)
        torch.cuda.synchronize()

    return {"h2d": nbytes / timed(h2d) / 1e9, "d2h": nbytes / timed(d2h) / 1e9,
            "both": 2 * nbytes / timed(both) / 1e9}


def bench_bandwidth(master, args):
    # A cross-layer Llama-8B-shaped cache: blocks of 16 tokens x 32 layers x K/V x 8 heads x 128
    # (2 MiB per block); 512 blocks = 1 GiB per direction.
    layers, bs, heads, d = 32, 16, 8, 128
    n = args.bw_blocks
    caches = [torch.randn(2 * n, layers, 2, bs, heads, d, device="cuda",
                          dtype=torch.bfloat16) for _ in range(1)]
    cache = caches[0]
    nbytes = n * cache[0].numel() * cache.element_size()
    pin = pinned_copy(nbytes)
    pin["bytes"] = nbytes
    store = open_store(master)
    mover = kvpool.GpuBlockMover(store, [cache], 2 * n, bs)
    ids_a, ids_b = list(range(n)), list(range(n, 2 * n))
    rep = [0]

    def keys(tag):
        return [f"bw/{tag}/{rep[0]}/{i}" for i in range(n)]

    def do_store():
        rep[0] += 1
        codes = mover.store_blocks(keys("s"), ids_a)
        assert codes == [0] * n, set(codes)

    t_store, store_phases = timed_phases(mover, "store", do_store, args.reps, STORE_PHASES)
    store.remove_all(True)
    # The same store with the checksums computed by the CPU at commit (the old path).
    cpu_mover = kvpool.GpuBlockMover(store, [cache], 2 * n, bs, gpu_checksums=False)

    def do_store_cpu_sums():
        rep[0] += 1
        codes = cpu_mover.store_blocks(keys("c"), ids_a)
        assert codes == [0] * n, set(codes)

    t_store_cpu = timed(do_store_cpu_sums, reps=max(2, args.reps // 2))
    del cpu_mover
    store.remove_all(True)
    # The checksum kernel alone over the same blocks (reads the GPU cache).
    seg = cache[0].numel() * cache.element_size()
    t_sum_us = kvpool._kvpool._checksum_blocks_time([cache.data_ptr()], [seg], [seg], ids_a, 20)
    load_keys = [f"bw/l/{i}" for i in range(n)]
    assert mover.store_blocks(load_keys, ids_a) == [0] * n

    def do_load():
        codes = mover.load_blocks(load_keys, ids_b)
        assert codes == [0] * n, set(codes)

    t_load, load_phases = timed_phases(mover, "load", do_load, args.reps, LOAD_PHASES)
    assert torch.equal(cache[:n], cache[n:])

    # Both at once: load set A into B's blocks while storing blocks A under new keys.
    import threading

    def do_both():
        rep[0] += 1
        ks = keys("both")
        err = []
        t = threading.Thread(target=lambda: err.append(mover.store_blocks(ks, ids_a)))
        t.start()
        codes = mover.load_blocks(load_keys, ids_b)
        t.join()
        assert codes == [0] * n and err[0] == [0] * n

    t_both = timed(do_both, reps=max(2, args.reps // 2))
    store.remove_all(True)
    r = {"bytes": nbytes, "pinned_h2d_GBps": pin["h2d"], "pinned_d2h_GBps": pin["d2h"],
         "pinned_both_GBps": pin["both"], "load_GBps": nbytes / t_load / 1e9,
         "store_GBps": nbytes / t_store / 1e9, "both_GBps": 2 * nbytes / t_both / 1e9,
         "store_cpu_checksums_GBps": nbytes / t_store_cpu / 1e9,
         "checksum_kernel_GBps": nbytes / (t_sum_us * 1e-6) / 1e9,
         "store_phases_ms": store_phases, "load_phases_ms": load_phases}
    r["load_vs_pinned"] = r["load_GBps"] / pin["h2d"]
    r["store_vs_pinned"] = r["store_GBps"] / pin["d2h"]
    r["both_vs_one_direction"] = r["both_GBps"] / max(r["load_GBps"], r["store_GBps"])
    results["bandwidth"] = r
    say(f"## Bandwidth, same-host pool, {nbytes / GiB:.2f} GiB of 2 MiB blocks (GpuBlockMover)")
    say("| | GB/s | x pinned copy |")
    say("|---|---|---|")
    say(f"| pinned copy host->GPU | {pin['h2d']:.1f} | 1.00 |")
    say(f"| pinned copy GPU->host | {pin['d2h']:.1f} | 1.00 |")
    say(f"| pinned copy both ways at once | {pin['both']:.1f} | |")
    say(f"| load (pool -> GPU cache) | {r['load_GBps']:.1f} | {r['load_vs_pinned']:.2f} |")
    say(f"| store (GPU cache -> pool, with commit; checksums on the GPU) | {r['store_GBps']:.1f} | "
        f"{r['store_vs_pinned']:.2f} |")
    say(f"| store, checksums by the CPU at commit (gpu_checksums=False) | "
        f"{r['store_cpu_checksums_GBps']:.1f} | {r['store_cpu_checksums_GBps'] / pin['d2h']:.2f} |")
    say(f"| checksum kernel alone ({n} blocks of 2 MiB, from the GPU cache) | "
        f"{r['checksum_kernel_GBps']:.1f} | |")
    say(f"| load + store at once | {r['both_GBps']:.1f} | {r['both_vs_one_direction']:.2f}x one "
        "direction |")
    say()
    fmt = lambda d: ", ".join(f"{k[:-3]} {v:.2f}" for k, v in d.items())
    say(f"Per call of {n} blocks, ms: store: {fmt(store_phases)}; load: {fmt(load_phases)}")
    say()
    if args.bw_batching:
        bench_batching(store, cache, n, bs, ids_a, ids_b, pin, args)
    del mover, cache, caches
    store.close()
    torch.cuda.empty_cache()


def bench_batching(store, cache, n, bs, ids_a, ids_b, pin, args):
    """The same 1 GiB store and load with movers that cut calls into other batches."""
    say("### Batch plans (first:middle:last[:staged first batch of stores]), same cache and pool")
    say("| plan | store GB/s | x pinned | to first copy ms | after last copy ms | load GB/s | "
        "x pinned | load to first copy ms |")
    say("|---|---|---|---|---|---|---|---|")
    rows = []
    for plan in args.bw_batching.split(","):
        fields = [int(x) for x in plan.split(":")]
        first, middle, last = fields[:3]
        staged = {"staged_first_batch_blocks": fields[3]} if len(fields) > 3 else {}
        mover = kvpool.GpuBlockMover(store, [cache], 2 * n, bs, first_batch_blocks=first,
                                     batch_blocks=middle, last_batch_blocks=last, **staged)
        rep = [0]

        def do_store():
            rep[0] += 1
            codes = mover.store_blocks([f"plan/{plan}/{rep[0]}/{i}" for i in range(n)], ids_a)
            assert codes == [0] * n, set(codes)

        t_store, store_phases = timed_phases(mover, "store", do_store, args.reps, STORE_PHASES)
        head, tail = store_phases["to_first_copy_ms"], store_phases["after_last_copy_ms"]
        load_keys = [f"plan/{plan}/1/{i}" for i in range(n)]

        def do_load():
            codes = mover.load_blocks(load_keys, ids_b)
            assert codes == [0] * n, set(codes)

        t_load, load_phases = timed_phases(mover, "load", do_load, args.reps, LOAD_PHASES)
        load_head = load_phases["to_first_copy_ms"]
        assert torch.equal(cache[:n], cache[n:])
        nbytes = pin["bytes"]
        row = {"plan": plan, "store_GBps": nbytes / t_store / 1e9,
               "load_GBps": nbytes / t_load / 1e9, "store_to_first_copy_ms": head,
               "store_after_last_copy_ms": tail, "load_to_first_copy_ms": load_head}
        rows.append(row)
        say(f"| {plan} | {row['store_GBps']:.1f} | {row['store_GBps'] / pin['d2h']:.2f} | "
            f"{head:.2f} | {tail:.2f} | {row['load_GBps']:.1f} | "
            f"{row['load_GBps'] / pin['h2d']:.2f} | {load_head:.2f} |")
        del mover
        store.remove_all(True)
    say()
    results["bandwidth_batching"] = rows


# --- 2. ops vs launchers -----------------------------------------------------------------

def op_time(fn, iters=200):
    for _ in range(10):
        fn()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(5):
        start.record()
        for _ in range(iters):
            fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) / iters)
    return statistics.median(times)


def graph_time(fn, iters=200):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=s):
            for _ in range(20):
                fn()
    torch.cuda.current_stream().wait_stream(s)
    return op_time(g.replay, iters=max(1, iters // 20)) / 20


def bench_ops(args):
    rows = []
    for batch, seq, qo, kvh in ((32, 4096, 32, 8), (8, 32768, 32, 8), (128, 2048, 32, 8)):
        d, bs = 128, 16
        blocks_per = seq // bs
        nb = batch * blocks_per
        q = torch.randn(batch, qo, d, device="cuda", dtype=torch.bfloat16)
        cache = torch.randn(2, nb, bs, kvh, d, device="cuda", dtype=torch.bfloat16)
        bt = torch.randperm(nb, device="cuda", dtype=torch.int32).view(batch, blocks_per)
        sl = torch.full((batch,), seq, dtype=torch.int32, device="cuda")
        o = ops.gqa_decode(q, cache, bt, sl)
        key = next(k for k in ops._plans if k[0] == "gqa_decode" and k[1][0] == batch and
                   k[1][5] == blocks_per)
        plan = ops._plans[key][0]
        layout = ops._gqa_layout(cache, d, None, "NHD", True)[0]
        lse = torch.empty(batch, qo, dtype=torch.float32, device="cuda")
        stream = torch.cuda.current_stream().cuda_stream
        cpp = statistics.median(kvpool._kvpool._gqa_decode_time(
            plan, q.data_ptr(), cache.data_ptr(), layout, bt.data_ptr(), sl.data_ptr(),
            1 / math.sqrt(d), o.data_ptr(), lse.data_ptr(), stream, 10, 200) for _ in range(5))
        eager = op_time(lambda: ops.gqa_decode(q, cache, bt, sl))
        graph = graph_time(lambda: ops.gqa_decode(q, cache, bt, sl))
        rows.append(("gqa_decode", f"batch {batch}, {seq} tokens, {qo}/{kvh} heads, d {d}", cpp,
                     eager, graph, plan.description))
        del q, cache, bt, sl
    for batch, seq, heads in ((32, 4096, 128), (4, 32768, 128), (64, 8192, 16)):
        bs = 64
        blocks_per = seq // bs
        nb = batch * blocks_per
        q = torch.randn(batch, heads, 576, device="cuda", dtype=torch.bfloat16)
        cache = torch.randn(nb, bs, 576, device="cuda", dtype=torch.bfloat16)
        bt = torch.randperm(nb, device="cuda", dtype=torch.int32).view(batch, blocks_per)
        sl = torch.full((batch,), seq, dtype=torch.int32, device="cuda")
        o = ops.mla_decode(q, cache, bt, sl)
        key = next(k for k in ops._plans if k[0] == "mla_decode" and k[1][0] == batch and
                   k[1][3] == blocks_per and k[1][1] == heads)
        plan = ops._plans[key][0]
        lse = torch.empty(batch, heads, dtype=torch.float32, device="cuda")
        stream = torch.cuda.current_stream().cuda_stream
        cpp = statistics.median(kvpool._kvpool._mla_decode_time(
            plan, q.data_ptr(), cache.data_ptr(), bt.data_ptr(), sl.data_ptr(),
            1 / math.sqrt(576), o.data_ptr(), lse.data_ptr(), stream, 10, 200) for _ in range(5))
        eager = op_time(lambda: ops.mla_decode(q, cache, bt, sl))
        graph = graph_time(lambda: ops.mla_decode(q, cache, bt, sl))
        rows.append(("mla_decode", f"batch {batch}, {seq} tokens, {heads} heads, bs {bs}", cpp,
                     eager, graph, plan.description))
        del q, cache, bt, sl
    results["ops"] = [dict(op=r[0], shape=r[1], launcher_us=r[2] * 1e3, op_eager_us=r[3] * 1e3,
                           op_graph_us=r[4] * 1e3, plan=r[5]) for r in rows]
    say("## torch ops vs the C++ launcher (per call, back-to-back launches, CUDA events)")
    say("| op | shape | C++ launcher us | op eager us | eager/launcher | op in CUDA graph us "
        "| graph/launcher |")
    say("|---|---|---|---|---|---|---|")
    for op, shape, cpp, eager, graph, _ in rows:
        say(f"| {op} | {shape} | {cpp * 1e3:.1f} | {eager * 1e3:.1f} | {eager / cpp:.3f} | "
            f"{graph * 1e3:.1f} | {graph / cpp:.3f} |")
    say()
    ops._plans.clear()
    torch.cuda.empty_cache()


# --- 3. TTFT on a Llama-3.1-8B shape ------------------------------------------------------

def build_llama(layers):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=layers,
                         num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                         vocab_size=128256, max_position_embeddings=131072, rope_theta=500000.0,
                         rms_norm_eps=1e-5, tie_word_embeddings=False)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # built in bf16 on the GPU: no float32 copy
    try:
        with torch.device("cuda"):
            model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(default)
    model.eval()
    return model, config


def cache_kv(past, layer):
    if hasattr(past, "layers"):
        return past.layers[layer].keys, past.layers[layer].values
    if hasattr(past, "key_cache"):
        return past.key_cache[layer], past.value_cache[layer]
    return past[layer][0], past[layer][1]


class PagedDecoder:
    """One token at a time through the model's own weights, attention by kvpool.ops.gqa_decode
    over a paged FlashAttention-layout cache per layer: (2, num_blocks, 16, 8, 128). Inputs
    are static tensors (token, position, block and slot of the new token's KV), so a step can
    be captured once as a CUDA graph and replayed for any position (capture(); step() then
    replays)."""

    def __init__(self, model, caches, block_table, block_size, wait_for_layer=None):
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        # wait_for_layer(i): called before layer i's attention reads the cache (an engine's
        # wait_for_layer_load), also while the step is captured.
        self.wait_for_layer = wait_for_layer
        self.m, self.caches, self.bs = model, caches, block_size
        self.rope = apply_rotary_pos_emb
        self.bt = block_table  # [1, max_blocks] int32 cuda
        self.cfg = model.config
        self.token = torch.zeros(1, 1, dtype=torch.long, device="cuda")
        self.pos = torch.zeros(1, 1, dtype=torch.long, device="cuda")
        self.block = torch.zeros(1, dtype=torch.long, device="cuda")
        self.slot = torch.zeros(1, dtype=torch.long, device="cuda")
        self.seq_lens = torch.zeros(1, dtype=torch.int32, device="cuda")
        self.graph = None
        self.logits = None

    @torch.no_grad()
    def _forward(self):
        m, cfg = self.m.model, self.cfg
        h = m.embed_tokens(self.token)
        cos, sin = m.rotary_emb(h, self.pos)
        nh, kvh, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        for i, (layer, cache) in enumerate(zip(m.layers, self.caches)):
            x = layer.input_layernorm(h)
            a = layer.self_attn
            q = a.q_proj(x).view(1, 1, nh, d).transpose(1, 2)
            k = a.k_proj(x).view(1, 1, kvh, d).transpose(1, 2)
            v = a.v_proj(x).view(1, 1, kvh, d)
            q, k = self.rope(q, k, cos, sin)
            cache[0].index_put_((self.block, self.slot), k[0, :, 0].unsqueeze(0))
            cache[1].index_put_((self.block, self.slot), v[0, 0].unsqueeze(0))
            if self.wait_for_layer is not None:
                self.wait_for_layer(i)
            o = ops.gqa_decode(q[:, :, 0].contiguous(), cache, self.bt, self.seq_lens,
                               max_seq_len=self.bt.shape[1] * self.bs)
            h = h + a.o_proj(o.view(1, 1, nh * d))
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        return self.m.lm_head(m.norm(h))[0, -1].float()

    def _set(self, token, pos):
        self.token.fill_(int(token))
        self.pos.fill_(pos)
        self.block.fill_(int(self.bt[0, pos // self.bs]))
        self.slot.fill_(pos % self.bs)
        self.seq_lens.fill_(pos + 1)

    def capture(self, token, pos):
        """Warm up at (token, pos), then capture a step; its KV write lands at pos."""
        self._set(token, pos)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            self._forward()
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph, stream=s):
                self.logits = self._forward()
        torch.cuda.current_stream().wait_stream(s)
        torch.cuda.synchronize()

    def step(self, token, pos):
        self._set(token, pos)
        if self.graph is None:
            return self._forward()
        self.graph.replay()
        return self.logits.clone()


def bench_ttft(master, args):
    model, cfg = build_llama(args.layers)
    bs, kvh, d = 16, cfg.num_key_value_heads, cfg.head_dim
    rows = []
    checks = []
    for prompt_k in args.prompts:
        prefix = prompt_k * 1024
        plen = prefix + 1  # the pool holds the first `prefix` tokens; the last is computed
        g = torch.Generator(device="cuda").manual_seed(prompt_k)
        prompt = torch.randint(0, cfg.vocab_size, (1, plen), device="cuda", generator=g)
        # Recompute: prefill the whole prompt (what a miss costs), first token from its logits.
        with torch.no_grad():
            def prefill():
                out = model(prompt, use_cache=True, logits_to_keep=1)
                tok = out.logits[0, -1].argmax()
                torch.cuda.synchronize()
                return out, tok
            prefill()
            times = []
            for _ in range(args.ttft_reps):
                out = None  # the previous run's cache freed first
                t0 = time.perf_counter()
                out, tok = prefill()
                times.append(time.perf_counter() - t0)
            t_recompute = statistics.median(times)
            ref_logits = [out.logits[0, -1].float()]
            ref_tokens = [int(tok)]
            past = out.past_key_values
            # transformers decoding on its own, for the comparison.
            nxt = tok.view(1, 1)
            for _ in range(args.decode_tokens - 1):
                o2 = model(nxt, past_key_values=past, use_cache=True)
                ref_logits.append(o2.logits[0, -1].float())
                nxt = o2.logits[0, -1].argmax().view(1, 1)
                ref_tokens.append(int(nxt))
        n_blocks = prefix // bs
        total_blocks = n_blocks + (args.decode_tokens + 1 + bs - 1) // bs + 1
        # Process A's paged cache: the prefill's KV of the first `prefix` tokens, blocks 0..n-1.
        a_caches = []
        for layer in range(cfg.num_hidden_layers):
            k, v = cache_kv(out.past_key_values if False else past, layer)
            c = torch.zeros(2, total_blocks, bs, kvh, d, device="cuda", dtype=torch.bfloat16)
            c[0, :n_blocks] = k[0, :, :prefix].transpose(0, 1).reshape(n_blocks, bs, kvh, d)
            c[1, :n_blocks] = v[0, :, :prefix].transpose(0, 1).reshape(n_blocks, bs, kvh, d)
            a_caches.append(c)
        del out, past
        hashes = [f"ttft{prompt_k}k/{i}".encode() for i in range(n_blocks)]
        store_a = open_store(master)
        worker_a = kvpool.StoreWorker(store_a, "bench/llama-3.1-8b-random", num_kv_heads=kvh,
                                      block_size=bs, kv_role="kv_producer")
        worker_a.register_kv_caches({f"l{i}": c for i, c in enumerate(a_caches)}, total_blocks)
        ready = torch.cuda.Event()
        ready.record()
        t0 = time.perf_counter()
        worker_a.get_finished({"a"}, [kvpool.ReqMeta("a", token_len_chunk=prefix,
                                                     block_ids=list(range(n_blocks)),
                                                     block_hashes=hashes, can_save=True)],
                              set(), ready)
        worker_a.wait_idle()
        t_store = time.perf_counter() - t0
        assert worker_a.sender_stats()["keys_stored"] == n_blocks, worker_a.sender_stats()
        kv_bytes = n_blocks * 2 * bs * kvh * d * 2 * cfg.num_hidden_layers
        worker_a.close()
        del a_caches
        torch.cuda.empty_cache()

        # Process B's side: its own store and cache, block ids reversed (a scatter, not a copy).
        b_caches = [torch.zeros(2, total_blocks, bs, kvh, d, device="cuda", dtype=torch.bfloat16)
                    for _ in range(cfg.num_hidden_layers)]
        b_ids = list(range(n_blocks - 1, -1, -1))
        rest = [n_blocks + i for i in range(total_blocks - n_blocks)]
        bt = torch.tensor([b_ids + rest], dtype=torch.int32, device="cuda")
        store_b = open_store(master)
        worker_b = kvpool.StoreWorker(store_b, "bench/llama-3.1-8b-random", num_kv_heads=kvh,
                                      block_size=bs, kv_role="kv_consumer")
        worker_b.register_kv_caches({f"l{i}": c for i, c in enumerate(b_caches)}, total_blocks)
        decoder = PagedDecoder(
            model, b_caches, bt, bs,
            wait_for_layer=lambda i: worker_b.wait_for_layer_load(
                i, torch.cuda.current_stream().cuda_stream))
        last = prompt[0, -1]
        decoder.step(last, prefix)  # warm-up (plans, kernels); overwritten below
        graphs = True
        try:
            decoder.capture(last, prefix)
        except Exception as e:  # eager steps then
            say(f"ttft: CUDA graph capture of the decode step failed ({e}); eager steps")
            decoder.graph, graphs = None, False
        torch.cuda.synchronize()

        def load_and_first_token(phases=None):
            t = time.perf_counter()
            hit = worker_b.lookup(plen, hashes)
            assert hit == prefix, (hit, prefix)
            t_lookup = time.perf_counter()
            worker_b.get_finished(set(), [kvpool.ReqMeta(
                "b", token_len_chunk=plen, block_ids=b_ids, block_hashes=hashes,
                load_spec=kvpool.LoadSpec(0, hit, can_load=True))])
            worker_b.wait_idle()
            assert worker_b.take_failed_load_block_ids() == set()
            t_load = time.perf_counter()
            logits = decoder.step(last, prefix)
            tok = int(logits.argmax())  # the first token on the host: the TTFT's end
            if phases is not None:
                phases.update(lookup_ms=(t_lookup - t) * 1e3, load_ms=(t_load - t_lookup) * 1e3,
                              first_step_ms=(time.perf_counter() - t_load) * 1e3)
            return logits, tok

        def layerwise_first_token(phases=None):
            # What an engine does with start_load_kv / wait_for_layer_load: the step starts as
            # soon as the loads are queued, and layer i's attention waits for layer i's KV. The
            # token counts only once the load is reported complete (checksums checked).
            t = time.perf_counter()
            hit = worker_b.lookup(plen, hashes)
            assert hit == prefix, (hit, prefix)
            t_lookup = time.perf_counter()
            req = kvpool.ReqMeta("b", token_len_chunk=plen, block_ids=b_ids, block_hashes=hashes,
                                 load_spec=kvpool.LoadSpec(0, hit, can_load=True))
            cpu = time.thread_time()
            worker_b.start_load_kv([req])
            t_started = time.perf_counter()
            cpu = time.thread_time() - cpu
            logits = decoder.step(last, prefix)
            tok = int(logits.argmax())
            t_step = time.perf_counter()
            _, recving = worker_b.get_finished(set(), [])
            assert "b" in recving, recving
            assert worker_b.take_failed_load_block_ids() == set()
            if phases is not None:
                phases.update(lookup_ms=(t_lookup - t) * 1e3, start_ms=(t_started - t_lookup) * 1e3,
                              step_ms=(t_step - t_started) * 1e3,
                              finish_ms=(time.perf_counter() - t_step) * 1e3,
                              start_cpu_ms=cpu * 1e3)
            return logits, tok

        def median_run(first_token):
            # Warm, then args.ttft_reps runs each into zeroed caches: the median run's time (s),
            # phases, logits (a copy: the step's output buffer is reused) and token.
            first_token()
            runs = []
            for _ in range(args.ttft_reps):
                for c in b_caches:
                    c.zero_()
                torch.cuda.synchronize()
                phases = {}
                t0 = time.perf_counter()
                logits, tok = first_token(phases)
                runs.append((time.perf_counter() - t0, phases, logits.clone(), tok))
            runs.sort(key=lambda r: r[0])
            return runs[len(runs) // 2]

        t_pool, phases, logits, tok = median_run(load_and_first_token)
        located = master_calls(args.master_http, "BatchGetReplicaList")
        t_layerwise, lw_phases, lw_logits, lw_tok = median_run(layerwise_first_token)
        # Master locate calls per layer-wise run (the lookup's, and any the load made).
        lw_locates = (master_calls(args.master_http, "BatchGetReplicaList") - located) / (
            args.ttft_reps + 1)
        start_cpu_ms = lw_phases.pop("start_cpu_ms")
        lw_same = lw_tok == tok and torch.equal(lw_logits, logits)
        times = []
        for i in range(args.ttft_reps):
            t0 = time.perf_counter()
            worker_b.get_finished(set(), [kvpool.ReqMeta(
                f"b2-{i}", token_len_chunk=plen, block_ids=b_ids, block_hashes=hashes,
                load_spec=kvpool.LoadSpec(0, prefix, can_load=True))])
            worker_b.wait_idle()
            times.append(time.perf_counter() - t0)
        t_load_only = statistics.median(times)

        # N decode tokens through kvpool.ops.gqa_decode. Free running (B's own greedy tokens),
        # compared with transformers' until they first differ; and teacher-forced (B fed
        # transformers' tokens), every step's logits against transformers'.
        free = [tok]
        nxt = tok
        for i in range(1, args.decode_tokens):
            nxt = int(decoder.step(nxt, prefix + i).argmax())
            free.append(nxt)
        agree = next((i for i, (a, b) in enumerate(zip(free, ref_tokens)) if a != b), len(free))
        max_diff = (logits - ref_logits[0]).abs().max().item()
        argmax_equal, margins = [tok == ref_tokens[0]], []
        ref_scale = max(r.abs().max().item() for r in ref_logits)
        for i in range(1, args.decode_tokens):
            lg = decoder.step(ref_tokens[i - 1], prefix + i)
            max_diff = max(max_diff, (lg - ref_logits[i]).abs().max().item())
            argmax_equal.append(int(lg.argmax()) == ref_tokens[i])
        for i, ok in enumerate(argmax_equal):
            if not ok:  # how close transformers' own top two were there
                top = ref_logits[i].topk(2).values
                margins.append(round((top[0] - top[1]).item(), 4))
        same = sum(argmax_equal)
        tokens = free

        # Over TCP: the same blocks through pinned staging and the TCP transport.
        mover = kvpool.GpuBlockMover(store_b, b_caches, total_blocks, bs, tcp=True)
        keys = [worker_b.token_database.key(h) for h in hashes]
        for c in b_caches:
            c.zero_()
        t0 = time.perf_counter()
        codes = mover.load_blocks(keys, b_ids)
        logits_tcp = decoder.step(last, prefix)
        tok_tcp = int(logits_tcp.argmax())
        t_tcp = time.perf_counter() - t0
        assert codes == [0] * n_blocks, set(codes)
        del mover
        worker_b.close()
        store_a.remove_all(True)
        store_a.close()
        store_b.close()
        del b_caches, decoder
        torch.cuda.empty_cache()
        rows.append(dict(prompt=plen, kv_bytes=kv_bytes, recompute_ms=t_recompute * 1e3,
                         pool_ms=t_pool * 1e3, layerwise_ms=t_layerwise * 1e3,
                         speedup_layerwise=t_recompute / t_layerwise, layerwise_phases=lw_phases,
                         layerwise_start_cpu_ms=start_cpu_ms, layerwise_locate_calls=lw_locates,
                         layerwise_logits_equal=lw_same, load_only_ms=t_load_only * 1e3,
                         tcp_ms=t_tcp * 1e3, store_ms=t_store * 1e3,
                         speedup=t_recompute / t_pool, speedup_tcp=t_recompute / t_tcp,
                         load_GBps=kv_bytes / t_load_only / 1e9, store_GBps=kv_bytes / t_store / 1e9,
                         tokens_equal=f"{same}/{len(tokens)}", first_token_equal=tok == ref_tokens[0],
                         free_running_agree=f"{agree}/{len(tokens)}", ref_margins_where_unequal=margins,
                         **phases,
                         tcp_first_token_equal=tok_tcp == ref_tokens[0],
                         max_logit_diff=max_diff, max_logit=ref_scale, graphs=graphs))
        say(f"ttft {plen}: recompute {t_recompute * 1e3:.1f} ms, pool {t_pool * 1e3:.1f} ms "
            f"(lookup {phases['lookup_ms']:.1f}, load {phases['load_ms']:.1f}, first step "
            f"{phases['first_step_ms']:.1f}), teacher-forced argmax {same}/{len(tokens)} "
            f"(transformers' top-2 margins where not: {margins}), free-running tokens equal "
            f"for {agree}/{len(tokens)}, max |dlogit| {max_diff:.3f} "
            f"(logits up to {ref_scale:.2f}); "
            f"layer-wise {t_layerwise * 1e3:.1f} ms ({t_recompute / t_layerwise:.1f}x; "
            + ", ".join(f"{k[:-3]} {v:.1f}" for k, v in lw_phases.items())
            + f"; start's CPU time {start_cpu_ms:.1f} ms, {lw_locates:.1f} master locate calls "
            f"per run), logits identical to the whole load's: {lw_same}")
    results["ttft"] = dict(layers=cfg.num_hidden_layers, rows=rows)
    say()
    say(f"## Time to first token, Llama-3.1-8B shape ({cfg.num_hidden_layers} of 32 layers), "
        "random weights, bf16, batch 1")
    say("| prompt tokens | KV GiB | recompute (prefill) ms | pool hit, same host ms (lookup + "
        "load + first step) | x | pool hit, layer-wise load ms (lookup + start + step + finish) "
        "| x | load alone ms (GB/s) | pool hit over TCP ms | x | store ms "
        "(GB/s) | argmax = transformers' (teacher-forced) | free-running tokens equal | max abs "
        "logit diff |")
    say("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        say(f"| {r['prompt']} | {r['kv_bytes'] / GiB:.2f} | {r['recompute_ms']:.1f} | "
            f"{r['pool_ms']:.1f} ({r['lookup_ms']:.1f} + {r['load_ms']:.1f} + "
            f"{r['first_step_ms']:.1f}) | {r['speedup']:.1f} | {r['layerwise_ms']:.1f} ("
            + " + ".join(f"{v:.1f}" for v in r['layerwise_phases'].values())
            + f") | {r['speedup_layerwise']:.1f} | {r['load_only_ms']:.1f} "
            f"({r['load_GBps']:.1f}) | {r['tcp_ms']:.1f} | {r['speedup_tcp']:.1f} | "
            f"{r['store_ms']:.1f} ({r['store_GBps']:.1f}) | {r['tokens_equal']} | "
            f"{r['free_running_agree']} | "
            f"{r['max_logit_diff']:.3f} (logits up to {r['max_logit']:.1f}) |")
    say()
    del model
    torch.cuda.empty_cache()


# --- 4. MLA ------------------------------------------------------------------------------

def bench_mla(master, args):
    layers, bs, tokens = args.mla_layers, 64, args.mla_tokens
    n = tokens // bs
    src = [torch.randn(n + 4, bs, 576, device="cuda", dtype=torch.bfloat16) for _ in range(layers)]
    dst = [torch.zeros_like(t) for t in src]
    hashes = [f"mla/{i}".encode() for i in range(n)]
    sa, sb = open_store(master), open_store(master)
    wa = kvpool.StoreWorker(sa, "bench/deepseek-shape", use_mla=True, block_size=bs,
                            kv_role="kv_producer")
    wa.register_kv_caches(src, n + 4)
    wb = kvpool.StoreWorker(sb, "bench/deepseek-shape", use_mla=True, block_size=bs,
                            kv_role="kv_consumer")
    wb.register_kv_caches(dst, n + 4)
    ev = torch.cuda.Event()
    ev.record()
    t0 = time.perf_counter()
    wa.get_finished(set(), [kvpool.ReqMeta("a", token_len_chunk=tokens, block_ids=list(range(n)),
                                           block_hashes=hashes, can_save=True)], set(), ev)
    wa.wait_idle()
    t_store = time.perf_counter() - t0
    ids = [i + 4 for i in range(n)]
    t0 = time.perf_counter()
    wb.get_finished(set(), [kvpool.ReqMeta("b", token_len_chunk=tokens, block_ids=ids,
                                           block_hashes=hashes,
                                           load_spec=kvpool.LoadSpec(0, tokens, can_load=True))])
    wb.wait_idle()
    t_load = time.perf_counter() - t0
    assert wb.take_failed_load_block_ids() == set()
    nbytes = n * bs * 576 * 2 * layers
    heads = 128
    q = torch.randn(1, heads, 576, device="cuda", dtype=torch.bfloat16)
    bt_src = torch.arange(n, dtype=torch.int32, device="cuda").view(1, n)
    bt_dst = torch.tensor([ids], dtype=torch.int32, device="cuda")
    sl = torch.tensor([tokens], dtype=torch.int32, device="cuda")
    o_src = ops.mla_decode(q, src[0], bt_src, sl)
    o_dst = ops.mla_decode(q, dst[0], bt_dst, sl)
    kv = src[0][:n].reshape(-1, 576).double()
    s = (q[0].double() @ kv.T) / math.sqrt(576)
    ref = torch.softmax(s, -1) @ kv[:, :512]
    err = ((o_dst[0].double() - ref).norm() / ref.norm()).item()
    equal = torch.equal(o_src, o_dst)
    results["mla"] = dict(layers=layers, tokens=tokens, bytes=nbytes, store_ms=t_store * 1e3,
                          load_ms=t_load * 1e3, load_GBps=nbytes / t_load / 1e9,
                          store_GBps=nbytes / t_store / 1e9, loaded_equals_source=equal,
                          rel_err_vs_torch=err)
    say(f"## MLA (DeepSeek-shaped latent cache: {layers} layers x {tokens} tokens x 576, bf16, "
        f"{nbytes / GiB:.2f} GiB)")
    say(f"store {t_store * 1e3:.1f} ms ({nbytes / t_store / 1e9:.1f} GB/s), load "
        f"{t_load * 1e3:.1f} ms ({nbytes / t_load / 1e9:.1f} GB/s); mla_decode over the loaded "
        f"cache == over the source: {equal}; rel. error vs torch float64: {err:.2e}")
    say()
    wa.close()
    wb.close()
    sa.remove_all(True)
    sa.close()
    sb.close()
    del src, dst
    torch.cuda.empty_cache()


# --- 5. Mooncake's raw-pointer calls on a GPU cache --------------------------------------

def bench_mooncake(master, args):
    """The seed connector's calls, unchanged, on a GPU cache: one key per block, one buffer
    per layer and K/V (Llama-3.1-8B shape: 32 layers, blocks of 16 tokens x 8 heads x 128,
    bf16: 64 buffers of 32 KiB, 2 MiB per key), the cache registered with register_buffer;
    batch_put_from_multi_buffers / batch_get_into_multi_buffers of mc_batch keys per call.
    The same calls on a pinned CPU cache of the same shape are the baseline (what the client
    itself costs); a pinned copy of the same bytes is the ceiling. Keys are removed after each
    timed store, so the pool's space (and this process's page mappings of it) is reused as in
    a steady state; the first store, into space this process never touched, is shown apart."""
    from kvpool.store import MooncakeDistributedStore

    layers, bs, heads, d = 32, 16, 8, 128
    n, per_call = args.mc_blocks, args.mc_batch
    part = bs * heads * d * 2
    nbytes = n * part * 2 * layers
    pin = pinned_copy(nbytes)
    store = MooncakeDistributedStore()
    assert store.setup("127.0.0.1", "P2PHANDSHAKE", 0, 0, "tcp", "", master) == 0
    rep = [0]
    rows = {}

    def run(device):
        if device == "cuda":
            caches = [torch.randn(2 * n, bs, heads, d, device="cuda", dtype=torch.bfloat16)
                      for _ in range(2 * layers)]
        else:
            caches = [torch.randn(2 * n, bs, heads, d, dtype=torch.bfloat16).pin_memory()
                      for _ in range(2 * layers)]
        for c in caches:
            assert store.register_buffer(c.data_ptr(), c.numel() * c.element_size()) == 0
        src = [[c[i].data_ptr() for c in caches] for i in range(n)]
        dst = [[c[i].data_ptr() for c in caches] for i in range(n, 2 * n)]
        sizes = [[part] * len(caches) for _ in range(n)]
        keys = []

        def do_store():
            rep[0] += 1
            keys[:] = [f"mc/{rep[0]}/{i}" for i in range(n)]
            torch.cuda.synchronize()
            for b in range(0, n, per_call):
                codes = store.batch_put_from_multi_buffers(keys[b:b + per_call],
                                                           src[b:b + per_call],
                                                           sizes[b:b + per_call])
                assert codes == [0] * len(codes), set(codes)  # Mooncake's convention: 0 stored

        def do_load():
            for b in range(0, n, per_call):
                codes = store.batch_get_into_multi_buffers(keys[b:b + per_call],
                                                           dst[b:b + per_call],
                                                           sizes[b:b + per_call])
                assert codes == [part * len(caches)] * len(codes), set(codes)

        times = []
        for _ in range(args.reps + 1):
            t = time.perf_counter()
            do_store()
            times.append(time.perf_counter() - t)
            if len(times) <= args.reps:
                store.remove_all(True)
        t_first, t_store = times[0], statistics.median(times[1:])
        t_load = timed(do_load, reps=args.reps)
        equal = all(torch.equal(c[:n], c[n:]) for c in caches)
        store.remove_all(True)
        for c in caches:
            store.unregister_buffer(c.data_ptr())
        return {"first_store_GBps": nbytes / t_first / 1e9, "store_GBps": nbytes / t_store / 1e9,
                "load_GBps": nbytes / t_load / 1e9, "loaded_equals_source": equal}

    for device in ("cpu", "cuda"):
        rows[device] = run(device)
        torch.cuda.empty_cache()
    store.close()
    r = {"bytes": nbytes, "keys": n, "keys_per_call": per_call, "buffers_per_key": 2 * layers,
         "pinned_d2h_GBps": pin["d2h"], "pinned_h2d_GBps": pin["h2d"], **rows}
    results["mooncake"] = r
    g, c = rows["cuda"], rows["cpu"]
    say(f"## Mooncake's multi-buffer calls on a GPU cache ({n} keys of {2 * layers} x "
        f"{part >> 10} KiB, {per_call} keys per call, {nbytes / GiB:.2f} GiB; same-host pool)")
    say("| | GPU cache GB/s | pinned CPU cache GB/s | GPU / CPU | GPU x pinned copy |")
    say("|---|---|---|---|---|")
    say(f"| batch_put_from_multi_buffers | {g['store_GBps']:.1f} | {c['store_GBps']:.1f} | "
        f"{g['store_GBps'] / c['store_GBps']:.2f} | {g['store_GBps'] / pin['d2h']:.2f} |")
    say(f"| batch_get_into_multi_buffers | {g['load_GBps']:.1f} | {c['load_GBps']:.1f} | "
        f"{g['load_GBps'] / c['load_GBps']:.2f} | {g['load_GBps'] / pin['h2d']:.2f} |")
    say(f"loaded cache == source: GPU {g['loaded_equals_source']}, CPU "
        f"{c['loaded_equals_source']}")
    say()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=".")
    p.add_argument("--sections", default="bandwidth,ops,ttft,mla,mooncake")
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--prompts", type=lambda s: [int(x) for x in s.split(",")], default=[2, 8, 32])
    p.add_argument("--decode-tokens", type=int, default=8)
    p.add_argument("--ttft-reps", type=int, default=5,
                   help="timed runs per time-to-first-token row (the median is reported)")
    p.add_argument("--bw-blocks", type=int, default=512)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--bw-batching", default="",
                   help="also time stores and loads with other batch plans, comma-separated "
                        "FIRST:MIDDLE:LAST[:STAGED] (GpuBlockMover's first_batch_blocks, "
                        "batch_blocks, last_batch_blocks, staged_first_batch_blocks)")
    p.add_argument("--pool", default="10GiB")
    p.add_argument("--segment-arg", action="append", default=[],
                   help="a kvpool-segment flag, e.g. --segment-arg=--verify-commits=false")
    p.add_argument("--no-prefault", action="store_true",
                   help="start the segment with --prefault=false (tests' setting)")
    p.add_argument("--mla-layers", type=int, default=61)
    p.add_argument("--mla-tokens", type=int, default=16384)
    p.add_argument("--mc-blocks", type=int, default=512)
    p.add_argument("--mc-batch", type=int, default=64)
    args = p.parse_args()
    sections = args.sections.split(",")
    pool = Pool()
    try:
        fields = pool.master_with_http(embedded_segment_size="0")
        master, args.master_http = fields["grpc"], fields["http"]
        pool.segment(master, size=args.pool, prefault=not args.no_prefault,
                     extra_args=args.segment_arg)
        if args.segment_arg:
            say(f"segment flags: {' '.join(args.segment_arg)}")
        say(f"# kvpool GPU benchmarks from Python ({torch.cuda.get_device_name()}, torch "
            f"{torch.__version__})")
        say()
        for name, fn in (("bandwidth", lambda: bench_bandwidth(master, args)),
                         ("ops", lambda: bench_ops(args)),
                         ("ttft", lambda: bench_ttft(master, args)),
                         ("mla", lambda: bench_mla(master, args)),
                         ("mooncake", lambda: bench_mooncake(master, args))):
            if name not in sections:
                continue
            t = time.perf_counter()
            try:
                fn()
            except Exception as e:  # report and go on with the next section
                import traceback
                traceback.print_exc()
                say(f"{name}: FAILED: {type(e).__name__}: {e}")
                results[f"{name}_error"] = repr(e)
            print(f"[{name} took {time.perf_counter() - t:.0f} s]", flush=True)
    finally:
        pool.stop()
        with open(os.path.join(args.out, "bench.json"), "w") as f:
            json.dump(results, f, indent=1)
        with open(os.path.join(args.out, "bench.md"), "w") as f:
            f.write("\n".join(lines) + "\n")
    failed = [k for k in results if k.endswith("_error")]
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
