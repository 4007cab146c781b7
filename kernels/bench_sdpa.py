#!/usr/bin/env python3
"""Times PyTorch SDPA on the attention rows of kvpool-kernels-bench and prints them side by side.

For each row of the bench's CSV (bf16): SDPA over a padded contiguous copy of the same cache
(every sequence padded to the row's longest, as a caller without paged attention would hold it),
CUDA events, warm-up, median of many runs, with each SDPA backend that accepts the shape, in two
forms: GQA as enable_gqa=True over q (batch, qo, 1, d), and with each kv head's query group as
query rows, q (batch, kv, group, d); MLA as the heads as query rows over the one latent head,
q (batch, 1, heads, 576), k (batch, 1, len, 576), v (batch, 1, len, 512). The best is compared.

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


def try_all(forms):
    """forms: {name: fn}; returns {form/backend: ms or None}. The math backend (scores in
    memory) only where no other backend accepts the shape."""
    timings = {}
    for form, fn in forms.items():
        for name, backend in BACKENDS.items():
            if name == "math" and any(t is not None for t in timings.values()):
                continue
            key = "%s/%s" % (form, name)
            try:
                with sdpa_kernel([backend]):
                    fn()
                    torch.cuda.synchronize()
                    timings[key] = median_ms(fn)
            except Exception:  # backend refuses the shape, or out of memory
                timings[key] = None
                torch.cuda.empty_cache()
    return timings


def matmul_ceiling():
    """The dense bf16 tensor-core rate in this run (TFLOP/s): an 8192^3 product through
    PyTorch (cuBLAS) on random data, median of 20; the compute ceiling of the MLA rows."""
    n = 8192
    a = torch.randn(n, n, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(n, n, dtype=torch.bfloat16, device="cuda")
    ms = median_ms(lambda: a @ b, warmup=5, reps=20)
    del a, b
    torch.cuda.empty_cache()
    return 2.0 * n ** 3 / (ms * 1e-3) / 1e12


def main():
    warnings.filterwarnings("ignore")  # backends that refuse a shape say so; we report n/a
    rows = list(csv.DictReader(open(sys.argv[1])))
    torch.manual_seed(0)
    mm = matmul_ceiling()
    print("\nbf16 matrix-product ceiling (8192^3 through torch.matmul, random data): "
          "**%.0f TFLOP/s**" % mm)
    for r in rows:  # the MLA rows' arithmetic against it (2 * tokens * heads * (576 + 512))
        if r["kind"] == "mla":
            batch, lo, hi, heads = (int(r[k]) for k in ("batch", "lo", "hi", "qo"))
            tokens = float(r["bytes"]) - 2.0 * batch * heads * (576 + 512) - 4.0 * batch * heads
            tokens /= 576 * 2
            tf = 2.0 * tokens * heads * (576 + 512) / (float(r["ms"]) * 1e-3) / 1e12
            ratio = float(r["bytes"]) / (float(r["ms"]) * 1e-3) / 1e12 / float(r["read_tbs"])
            print("- MLA %s %d heads, %d x %d-%d: %.0f TFLOP/s = %.2fx of the matrix ceiling, "
                  "%.2fx of the read ceiling" % (r["rows"], heads, batch, lo, hi, tf, tf / mm,
                                                   ratio))
    print("\n### Attention decode vs PyTorch SDPA (torch %s) over a padded contiguous copy\n"
          % torch.__version__)
    print("| kind | rows | heads | d | batch | lengths lo-hi | kvpool us | SDPA us (best) | "
          "kvpool / SDPA speed | best form/backend |")
    print("| --- | --- | --- | ---: | ---: | --- | ---: | ---: | ---: | --- |")
    for r in rows:
        kind = r["kind"]
        qo, kv, d, batch, lo, hi = (int(r[k]) for k in ("qo", "kv", "d", "batch", "lo", "hi"))
        ours_ms = float(r["ms"])
        torch.cuda.empty_cache()
        if kind == "gqa":
            group = qo // kv
            k = torch.randn(batch, kv, hi, d, dtype=torch.bfloat16, device="cuda")
            v = torch.randn(batch, kv, hi, d, dtype=torch.bfloat16, device="cuda")
            q = torch.randn(batch, qo, 1, d, dtype=torch.bfloat16, device="cuda")
            qg = q.view(batch, kv, group, d)
            forms = {
                "enable_gqa": lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True),
                "group-rows": lambda: F.scaled_dot_product_attention(qg, k, v),
            }
        else:
            k = torch.randn(batch, 1, hi, 576, dtype=torch.bfloat16, device="cuda")
            v = k[..., :512]
            q = torch.randn(batch, 1, qo, 576, dtype=torch.bfloat16, device="cuda")
            vc = v.contiguous()
            forms = {"heads-rows": lambda: F.scaled_dot_product_attention(q, k, vc)}
        timings = try_all(forms)
        del k, v, q
        ok = {n: t for n, t in timings.items() if t is not None}
        heads = "%d/%d" % (qo, kv) if kind == "gqa" else str(qo)
        if not ok:
            print("| %s | %s | %s | %d | %d | %d-%d | %.1f | n/a | n/a | none accepted |"
                  % (kind, r["rows"], heads, d, batch, lo, hi, ours_ms * 1e3))
            continue
        best_name = min(ok, key=ok.get)
        best = ok[best_name]
        print("| %s | %s | %s | %d | %d | %d-%d | %.1f | %.1f | %.2fx | %s |" % (
            kind, r["rows"], heads, d, batch, lo, hi, ours_ms * 1e3, best * 1e3, best / ours_ms,
            best_name))
        sys.stdout.flush()


if __name__ == "__main__":
    main()
