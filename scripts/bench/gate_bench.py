"""Gate throughput and latency on a Redis server, next to redis-benchmark's trivial EVALSHA.

    python scripts/bench/gate_bench.py [--url redis://127.0.0.1:6379/0] [--pairs 20000] [--threads 8]

Each pair is one reserve + one settle (two Lua calls), from `--threads` client threads.
Prints a Markdown table (the README's) to stdout. Not a test: numbers, not assertions.
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import subprocess
import threading
import time
import uuid

from volc_quota_guard.gate import Gate, Snapshot
from volc_quota_guard.gate.keys import KeySpace
from volc_quota_guard.gate.records import Records
from volc_quota_guard.gate.store import connect


def bench_gate(url: str, pairs: int, threads: int) -> dict[str, float]:
    client = connect(url)
    ks = KeySpace(f"vqgbench-{uuid.uuid4().hex[:8]}")
    pools = [f"bench/model-{i}" for i in range(threads)]
    gate = Gate(client, ks)
    now_ms = int(client.time()[0]) * 1000
    for pool in pools:
        gate.install_snapshot(pool, Snapshot(10**13, 0, 0, 0, 10**13, now_ms + 3_600_000, 0))
    lat_reserve: list[float] = []
    lat_settle: list[float] = []
    per = pairs // threads
    lock = threading.Lock()

    def worker(i: int) -> None:
        g = Gate(connect(url), ks)  # one connection per thread, as proxy workers have
        pool = pools[i % len(pools)] if i % 2 else pools[0]  # half the threads share one hot pool
        r, s = [], []
        for n in range(per):
            rid = f"{i}-{n}"
            t0 = time.perf_counter()
            g.reserve(pool, rid, 5_000)
            t1 = time.perf_counter()
            g.settle(pool, rid, 3_000)
            t2 = time.perf_counter()
            r.append(t1 - t0)
            s.append(t2 - t1)
        with lock:
            lat_reserve.extend(r)
            lat_settle.extend(s)

    ts = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    start = time.perf_counter()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    elapsed = time.perf_counter() - start
    Records(client, ks).clear()
    q = statistics.quantiles
    return {
        "pairs_per_s": per * threads / elapsed,
        "reserve_p50_ms": q(lat_reserve, n=100)[49] * 1000,
        "reserve_p99_ms": q(lat_reserve, n=100)[98] * 1000,
        "settle_p50_ms": q(lat_settle, n=100)[49] * 1000,
        "settle_p99_ms": q(lat_settle, n=100)[98] * 1000,
    }


def bench_redis_evalsha(url: str, requests: int, clients: int) -> float | None:
    exe = shutil.which("redis-benchmark")
    if not exe:
        return None
    m = re.match(r"redis://([^:/]+):(\d+)", url)
    host, port = (m.group(1), m.group(2)) if m else ("127.0.0.1", "6379")
    sha = connect(url).script_load("return 1")
    out = subprocess.run([exe, "-h", host, "-p", port, "-n", str(requests), "-c", str(clients), "-q",
                          "evalsha", sha, "0"], capture_output=True, text=True, check=True).stdout
    found = re.findall(r"([\d.]+) requests per second", out)
    return float(found[-1]) if found else None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="redis://127.0.0.1:6379/0")
    ap.add_argument("--pairs", type=int, default=20_000)
    ap.add_argument("--threads", type=int, default=8)
    args = ap.parse_args()
    g = bench_gate(args.url, args.pairs, args.threads)
    base = bench_redis_evalsha(args.url, args.pairs * 2, args.threads)
    print("| measure | value |")
    print("|---|---|")
    print(f"| gate reserve+settle pairs/s ({args.threads} threads) | {g['pairs_per_s']:,.0f} |")
    print(f"| gate Lua calls/s (2 per pair) | {2 * g['pairs_per_s']:,.0f} |")
    print(f"| reserve p50 / p99 | {g['reserve_p50_ms']:.3f} ms / {g['reserve_p99_ms']:.3f} ms |")
    print(f"| settle p50 / p99 | {g['settle_p50_ms']:.3f} ms / {g['settle_p99_ms']:.3f} ms |")
    if base is not None:
        print(f"| redis-benchmark `EVALSHA return 1` calls/s (-c {args.threads}) | {base:,.0f} |")


if __name__ == "__main__":
    main()
