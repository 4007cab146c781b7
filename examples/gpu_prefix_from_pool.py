#!/usr/bin/env python3
"""A real model's prefix through the pool, from Python on a GPU, in two separate processes.

    # a pool: kvpool-master and a kvpool-segment on this machine (or --start-pool)
    python3 examples/gpu_prefix_from_pool.py --master HOST:PORT --role producer
    python3 examples/gpu_prefix_from_pool.py --master HOST:PORT --role consumer
    python3 examples/gpu_prefix_from_pool.py --start-pool          # both, each its own process

The model is Llama-3.1-8B-shaped with random weights from a fixed seed (transformers
LlamaConfig; nothing is downloaded; --layers for fewer layers). Its paged KV cache is one
FlashAttention-layout tensor (2, num_blocks, 16, 8, 128) per layer, registered as CUDA tensors
with kvpool.StoreWorker.

producer (process A): prefills the prompt with transformers, writes the KV of its full blocks
into its paged cache and stores them through StoreWorker (waiting on a CUDA event).
consumer (process B): builds the same model and prompt, asks lookup() how many tokens the pool
holds, loads them into its own paged cache (other block ids), computes the rest of the prompt
(the last token) and decodes --decode-tokens tokens with kvpool.ops.gqa_decode over the paged
cache. Then, as the check, transformers decodes the whole prompt on its own: B's logits (fed
transformers' tokens) must be within --tolerance of its logits, and every greedy token (the
first included) must equal its own unless transformers' top two logits are within --tie-margin
there (bf16 ties, common with random weights). Prints one JSON line; exit 1 if a check
fails.
"""

import argparse
import json
import os
import subprocess
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "engine_plugin", "python", "tools"))
sys.path.insert(0, os.path.join(ROOT, "engine_plugin", "python", "tests"))

import kvpool  # noqa: E402
from gpu_bench import PagedDecoder, build_llama, cache_kv, open_store  # noqa: E402

BLOCK = 16
MODEL = "example/llama-3.1-8b-random"


def prompt_and_hashes(args, vocab):
    g = torch.Generator(device="cuda").manual_seed(args.seed)
    prompt = torch.randint(0, vocab, (1, args.prompt_tokens + 1), device="cuda", generator=g)
    n_blocks = args.prompt_tokens // BLOCK
    # The engine's chained block hashes would come from the tokens; any stable names will do.
    return prompt, [f"{args.seed}/{args.prompt_tokens}/{i}".encode() for i in range(n_blocks)]


def make_worker(args, cfg, num_blocks, role):
    store = open_store(args.master)
    caches = [torch.zeros(2, num_blocks, BLOCK, cfg.num_key_value_heads, cfg.head_dim,
                          dtype=torch.bfloat16, device="cuda")
              for _ in range(cfg.num_hidden_layers)]
    worker = kvpool.StoreWorker(store, MODEL, num_kv_heads=cfg.num_key_value_heads,
                                block_size=BLOCK, kv_role=role)
    worker.register_kv_caches({f"model.layers.{i}": c for i, c in enumerate(caches)}, num_blocks)
    assert worker.on_gpu
    return store, worker, caches


def producer(args):
    model, cfg = build_llama(args.layers)
    prompt, hashes = prompt_and_hashes(args, cfg.vocab_size)
    n = len(hashes)
    store, worker, caches = make_worker(args, cfg, n + 4, "kv_producer")
    with torch.no_grad():
        out = model(prompt[:, : n * BLOCK], use_cache=True, logits_to_keep=1)
    for layer, cache in enumerate(caches):
        k, v = cache_kv(out.past_key_values, layer)
        for kv, t in ((0, k), (1, v)):
            cache[kv, :n] = t[0].transpose(0, 1).reshape(n, BLOCK, cfg.num_key_value_heads,
                                                         cfg.head_dim)
    ready = torch.cuda.Event()
    ready.record()
    t0 = time.perf_counter()
    worker.get_finished({"a"}, [kvpool.ReqMeta("a", token_len_chunk=n * BLOCK,
                                               block_ids=list(range(n)), block_hashes=hashes,
                                               can_save=True)], set(), ready)
    worker.wait_idle()
    stats = worker.sender_stats()
    worker.close()
    store.close()
    result = dict(role="producer", blocks=n, stored=stats["keys_stored"],
                  store_ms=round((time.perf_counter() - t0) * 1e3, 1))
    print(json.dumps(result), flush=True)
    return 0 if stats["keys_stored"] == n else 1


def consumer(args):
    model, cfg = build_llama(args.layers)
    prompt, hashes = prompt_and_hashes(args, cfg.vocab_size)
    n = len(hashes)
    plen = prompt.shape[1]
    total = n + (args.decode_tokens + BLOCK) // BLOCK + 1
    store, worker, caches = make_worker(args, cfg, total, "kv_consumer")
    ids = list(range(n - 1, -1, -1))  # not the producer's ids: the load scatters
    table = torch.tensor([ids + list(range(n, total))], dtype=torch.int32, device="cuda")
    decoder = PagedDecoder(model, caches, table, BLOCK)

    t0 = time.perf_counter()
    hit = worker.lookup(plen, hashes)
    worker.get_finished(set(), [kvpool.ReqMeta("b", token_len_chunk=plen, block_ids=ids,
                                               block_hashes=hashes,
                                               load_spec=kvpool.LoadSpec(0, hit, can_load=True))])
    worker.wait_idle()
    failed = worker.take_failed_load_block_ids()
    t_load = time.perf_counter() - t0
    if hit != n * BLOCK or failed:
        print(json.dumps(dict(role="consumer", error=f"hit {hit} of {n * BLOCK} tokens, "
                              f"failed blocks {sorted(failed)[:8]}")), flush=True)
        return 1
    tokens, logits = [], []
    nxt = int(prompt[0, -1])
    for i in range(args.decode_tokens):  # the prompt's last token, then greedy decoding
        lg = decoder.step(nxt, n * BLOCK + i)
        logits.append(lg)
        nxt = int(lg.argmax())
        tokens.append(nxt)

    # The check: transformers on its own over the whole prompt.
    with torch.no_grad():
        out = model(prompt, use_cache=True, logits_to_keep=1)
        ref_logits, ref_tokens = [out.logits[0, -1].float()], [int(out.logits[0, -1].argmax())]
        past = out.past_key_values
        for _ in range(args.decode_tokens - 1):
            o = model(torch.tensor([[ref_tokens[-1]]], device="cuda"), past_key_values=past,
                      use_cache=True)
            ref_logits.append(o.logits[0, -1].float())
            ref_tokens.append(int(o.logits[0, -1].argmax()))
    # B fed transformers' tokens, step by step.
    forced = [decoder.step(int(prompt[0, -1]), n * BLOCK)]
    for i in range(1, args.decode_tokens):
        forced.append(decoder.step(ref_tokens[i - 1], n * BLOCK + i))
    max_diff = max((f - r).abs().max().item() for f, r in zip(forced, ref_logits))
    ties = []
    ok = max_diff <= args.tolerance
    for i, (f, r) in enumerate(zip(forced, ref_logits)):
        if int(f.argmax()) != ref_tokens[i]:
            top = r.topk(2).values
            margin = (top[0] - top[1]).item()
            ties.append(round(margin, 4))
            ok = ok and margin <= args.tie_margin
    agree = next((i for i, (a, b) in enumerate(zip(tokens, ref_tokens)) if a != b), len(tokens))
    worker.close()
    store.close()
    print(json.dumps(dict(role="consumer", prompt=plen, loaded_tokens=hit,
                          load_ms=round(t_load * 1e3, 1), tokens=tokens, reference=ref_tokens,
                          greedy_equal_for=agree, max_abs_logit_diff=round(max_diff, 4),
                          unequal_argmax_ref_margins=ties, ok=ok)), flush=True)
    return 0 if ok else 1


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--master", help="kvpool-master's gRPC address")
    p.add_argument("--role", choices=["producer", "consumer"])
    p.add_argument("--start-pool", action="store_true",
                   help="start a master and a segment (KVPOOL_MASTER_BIN/KVPOOL_SEGMENT_BIN), "
                        "then the producer and the consumer, each in its own process")
    p.add_argument("--pool-size", default="4GiB")
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--prompt-tokens", type=int, default=8192, help="a multiple of 16")
    p.add_argument("--decode-tokens", type=int, default=8)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--tolerance", type=float, default=1.0, help="max abs logit difference")
    p.add_argument("--tie-margin", type=float, default=0.125,
                   help="a greedy token may differ where transformers' top two are this close")
    args = p.parse_args()
    if args.prompt_tokens % BLOCK:
        p.error(f"--prompt-tokens must be a multiple of {BLOCK}")
    if args.start_pool:
        from conftest import Pool

        pool = Pool()
        try:
            master = pool.master(embedded_segment_size="0")
            pool.segment(master, size=args.pool_size, prefault=True)
            rc = 0
            for role in ("producer", "consumer"):
                argv = [sys.executable, os.path.abspath(__file__), "--master", master,
                        "--role", role] + [a for a in sys.argv[1:] if a != "--start-pool"]
                rc |= subprocess.run(argv).returncode
            return rc
        finally:
            pool.stop()
    if not args.master or not args.role:
        p.error("--master and --role (or --start-pool)")
    return producer(args) if args.role == "producer" else consumer(args)


if __name__ == "__main__":
    sys.exit(main())
