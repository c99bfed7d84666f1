"""The scenario fuzzer's cost per seed, in one process: wall time, process CPU and Redis round trips.

    python scripts/bench/fuzz_bench.py [--url redis://127.0.0.1:6379/0] [--seeds 0:20]

Round trips are counted by wrapping redis-py's command and pipeline calls (a pipeline is one):
they do not depend on the machine's load, so they compare two versions of the guard even on a
busy machine where the times do not. Not a test: numbers, not assertions.
"""

from __future__ import annotations

import argparse
import time
from collections import Counter
from typing import Any

import redis
from redis.client import Pipeline

from volc_quota_guard.simulator.fuzz import run_seed


def count_round_trips() -> Counter[str]:
    """Count every command redis-py sends from now on (each pipeline as one)."""
    counts: Counter[str] = Counter()
    command, execute = redis.Redis.execute_command, Pipeline.execute

    def counted_command(self: redis.Redis, *args: Any, **kw: Any) -> Any:
        counts[str(args[0])] += 1
        return command(self, *args, **kw)

    def counted_pipeline(self: Pipeline, *args: Any, **kw: Any) -> Any:
        counts["(pipeline)"] += 1
        return execute(self, *args, **kw)

    redis.Redis.execute_command = counted_command  # type: ignore[method-assign]
    Pipeline.execute = counted_pipeline  # type: ignore[method-assign]
    return counts


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", default="redis://127.0.0.1:6379/0")
    p.add_argument("--seeds", default="0:20", help="A:B, B excluded")
    args = p.parse_args()
    lo, hi = (int(x) for x in args.seeds.split(":"))
    counts = count_round_trips()
    wall, cpu = time.perf_counter(), time.process_time()
    requests = 0
    for seed in range(lo, hi):
        case = run_seed(seed, store_url=args.url)
        if case.failed:
            raise SystemExit(f"seed {seed} failed: {case}")
        requests += case.requests
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    seeds = hi - lo
    trips = sum(counts.values())
    print(f"{seeds} seeds, {requests} requests: {wall / seeds:.2f} s wall and {cpu / seeds:.2f} s CPU "
          f"per seed, {trips / seeds:,.0f} Redis round trips per seed")
    print("  " + ", ".join(f"{k} {v}" for k, v in counts.most_common()))


if __name__ == "__main__":
    main()
