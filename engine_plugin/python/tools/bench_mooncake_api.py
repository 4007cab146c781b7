"""What kvpool.store's Mooncake layer costs over the native store: batch_put_from and
batch_get_into of the same keys through kvpool.store.MooncakeDistributedStore and through
kvpool.Store, against a running kvpool-master (with a segment of enough room).

    PYTHONPATH=build/engine_plugin/python/site /usr/bin/python3 \\
        engine_plugin/python/tools/bench_mooncake_api.py --master 127.0.0.1:50051 \\
        --keys 64 --value-bytes 65536 --rounds 50

Prints, per store and call, the median time of one batch and the bytes per second (after
--warmup unmeasured rounds).
"""

import argparse
import ctypes
import statistics
import time

import kvpool
from kvpool.store import MooncakeDistributedStore


def run(store, label, args, keys, ptrs, sizes, dst_ptrs):
    put_times, get_times = [], []
    # Unmeasured warm-up rounds first: the segment's pages are touched on first write.
    for r in range(-args.warmup, args.rounds):
        round_keys = [f"{label}-{r}-{k}" for k in keys]
        t0 = time.perf_counter()
        codes = store.batch_put_from(round_keys, ptrs, sizes)
        t1 = time.perf_counter()
        got = store.batch_get_into(round_keys, dst_ptrs, sizes)
        t2 = time.perf_counter()
        assert all(c >= 0 for c in codes), codes
        assert got == sizes, got
        if r >= 0:
            put_times.append(t1 - t0)
            get_times.append(t2 - t1)
        store.batch_remove(round_keys, True) if hasattr(store, "batch_remove") else None
    batch_bytes = sum(sizes)
    for call, times in (("batch_put_from", put_times), ("batch_get_into", get_times)):
        median = statistics.median(times)
        print(f"{label:>26} {call:>15}: {median * 1e3:8.3f} ms/batch "
              f"{batch_bytes / median / 1e9:6.2f} GB/s")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--master", required=True)
    parser.add_argument("--keys", type=int, default=64)
    parser.add_argument("--value-bytes", type=int, default=65536)
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=10)
    args = parser.parse_args()

    n, size = args.keys, args.value_bytes
    src = (ctypes.c_ubyte * (n * size))()
    dst = (ctypes.c_ubyte * (n * size))()
    ctypes.memset(src, 7, n * size)
    base, out = ctypes.addressof(src), ctypes.addressof(dst)
    keys = [f"k{i}" for i in range(n)]
    ptrs = [base + i * size for i in range(n)]
    dst_ptrs = [out + i * size for i in range(n)]
    sizes = [size] * n

    for label, store in (("kvpool.Store (native)", kvpool.Store()),
                         ("MooncakeDistributedStore", MooncakeDistributedStore())):
        assert store.setup({"master_server_address": args.master, "local_hostname": "127.0.0.1",
                            "global_segment_size": 0, "local_buffer_size": 0}) == 0
        store.register_buffer(base, n * size)
        store.register_buffer(out, n * size)
        run(store, label, args, keys, ptrs, sizes, dst_ptrs)
        store.close()


if __name__ == "__main__":
    main()
