"""Store throughput: upload/download MB/s and objects/s through S3Store (against a moto_server on loopback
that this script starts) and through LocalStore (a temporary folder).

Usage::

    python benchmarks/bench_store.py                 # 100 x 1 MB and 1,000 x 10 KB, 1 and 8 threads
    python benchmarks/bench_store.py --threads 1 --big 20 --small 200   # quicker

Prints one Markdown table row per (backend, workload, threads); paste into BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for tests.s3_server's moto helpers

from rapid.infra.s3 import S3Store  # noqa: E402
from rapid.infra.store import LocalStore, Store  # noqa: E402
from tests.s3_server import start_moto_server, stop, use_dummy_credentials  # noqa: E402


def timed(threads: int, fn: Callable[[int], object], count: int) -> float:
    start = time.perf_counter()
    if threads == 1:
        for i in range(count):
            fn(i)
    else:
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(fn, range(count)))
    return time.perf_counter() - start


def run(store: Store, name: str, count: int, size: int, threads: int) -> list[str]:
    payload = os.urandom(size)
    folder = f"bench/{count}x{size}/t{threads}"
    keys = [f"{folder}/{i:06d}.rxp" for i in range(count)]
    put_s = timed(threads, lambda i: store.put(keys[i], payload), count)
    list_start = time.perf_counter()
    listed = store.list(folder + "/")
    list_s = time.perf_counter() - list_start
    assert len(listed) == count
    get_s = timed(threads, lambda i: store.get(keys[i]), count)
    del_s = timed(threads, lambda i: store.delete(keys[i]), count)
    mb = count * size / 1e6
    backend = type(store).__name__
    return [
        f"| {backend} | {name} | {threads} | upload | {mb / put_s:,.1f} | {count / put_s:,.0f} |",
        f"| {backend} | {name} | {threads} | download | {mb / get_s:,.1f} | {count / get_s:,.0f} |",
        f"| {backend} | {name} | {threads} | list | – | {count / list_s:,.0f} |",
        f"| {backend} | {name} | {threads} | delete | – | {count / del_s:,.0f} |",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--big", type=int, default=100, help="number of 1 MB objects")
    parser.add_argument("--small", type=int, default=1000, help="number of 10 KB objects")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 8])
    args = parser.parse_args()
    workloads = [(f"{args.big} x 1 MB", args.big, 1_000_000), (f"{args.small} x 10 KB", args.small, 10_000)]

    use_dummy_credentials()
    proc, endpoint = start_moto_server()
    rows = []
    try:
        s3 = S3Store("s3://bench/run", endpoint_url=endpoint, create_bucket=True)
        with tempfile.TemporaryDirectory() as tmp:
            local = LocalStore(tmp)
            for store in (s3, local):
                for name, count, size in workloads:
                    for threads in args.threads:
                        rows += run(store, name, count, size, threads)
    finally:
        stop(proc)
    print("| backend | workload | threads | operation | MB/s | objects/s |")
    print("|---|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
