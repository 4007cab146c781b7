#!/usr/bin/env python3
"""Times PyTorch SDPA on the GQA decode rows of kvpool-kernels-bench and prints them side by side.

For each row of the bench's CSV (64/8 heads, d128, bf16): SDPA over a contiguous copy of the
same cache, q (batch, 64, 1, 128), k/v (batch, 8, context, 128), enable_gqa=True, with each SDPA
backend that accepts it; CUDA events, warm-up, median of many runs. The best backend is the one
compared against.

    python3 kernels/bench_sdpa.py BENCH_CSV
"""
import csv
import statistics
import sys
import warnings

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

BACKENDS = {
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "math": SDPBackend.MATH,
}


def median_ms(fn, warmup=3, reps=20):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def main():
    warnings.filterwarnings("ignore")  # backends that refuse a shape say so; we report n/a
    rows = [r for r in csv.DictReader(open(sys.argv[1])) if r["kind"] == "gqa"]
    torch.manual_seed(0)
    print("\n### GQA decode vs PyTorch SDPA (torch %s) over a contiguous copy of the cache\n"
          % torch.__version__)
    print("| block | batch | context | kvpool us | SDPA us (best backend) | SDPA TB/s | "
          "kvpool / SDPA speed | backends tried (us) |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    tensors, timings_by_key = None, {}
    for r in rows:
        qo, kv, d, bs, batch, ctx = (int(r[k]) for k in ("qo", "kv", "d", "bs", "batch", "ctx"))
        ours_ms = float(r["ms"])
        nbytes = float(r["bytes"])
        key = (batch, ctx)
        if key not in timings_by_key:
            tensors = None
            torch.cuda.empty_cache()
            k = torch.randn(batch, kv, ctx, d, dtype=torch.bfloat16, device="cuda")
            v = torch.randn(batch, kv, ctx, d, dtype=torch.bfloat16, device="cuda")
            q = torch.randn(batch, qo, 1, d, dtype=torch.bfloat16, device="cuda")
            tensors = (q, k, v)
            timings = {}
            for name, backend in BACKENDS.items():
                if name == "math" and batch * ctx > 64 * 8192:
                    continue  # materializes the scores; far slower and memory hungry
                try:
                    with sdpa_kernel([backend]):
                        fn = lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
                        fn()
                        torch.cuda.synchronize()
                        timings[name] = median_ms(fn)
                except Exception as e:  # backend does not support this shape
                    timings[name] = None
            timings_by_key[key] = timings
            del q, k, v
            tensors = None
        timings = timings_by_key[key]
        ok = {n: t for n, t in timings.items() if t is not None}
        tried = ", ".join("%s %s" % (n, "%.0f" % (t * 1e3) if t is not None else "n/a")
                          for n, t in timings.items())
        if not ok:
            print("| %d | %d | %d | %.1f | n/a | n/a | n/a | %s |" % (bs, batch, ctx, ours_ms * 1e3, tried))
            continue
        best = min(ok.values())
        print("| %d | %d | %d | %.1f | %.1f | %.2f | %.2fx | %s |" % (
            bs, batch, ctx, ours_ms * 1e3, best * 1e3, nbytes / (best * 1e-3) / 1e12,
            best / ours_ms, tried))
        sys.stdout.flush()


if __name__ == "__main__":
    main()
