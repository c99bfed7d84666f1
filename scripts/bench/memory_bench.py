"""Redis memory and key count of one pool, day by day over a month of traffic, on a real server.

    python scripts/bench/memory_bench.py [--url redis://127.0.0.1:6379/0] [--per-day 20000] [--days 30]

Drives reserve + settle through the gate on a manual clock (the scripts' retention rules apply
exactly as in production; a snapshot is installed every 500 requests, as syncs would) and prints,
at the end of each simulated day, the number of keys under the prefix and their MEMORY USAGE,
then the per-key breakdown. Flat rows after day 2 mean nothing grows without bound.
Not a test: numbers, not assertions.
"""

from __future__ import annotations

import argparse
import uuid

import redis

from volc_quota_guard.clock import ManualClock
from volc_quota_guard.gate import Gate, Snapshot
from volc_quota_guard.gate.keys import KeySpace
from volc_quota_guard.gate.store import connect

POOL = "bench/deepseek-v4-flash-ga-260731"
DAY_MS = 86_400_000


def footprint(client: redis.Redis, prefix: str) -> tuple[int, int]:
    """(keys, bytes) under `prefix`."""
    keys = list(client.scan_iter(f"{prefix}:*", count=1000))
    return len(keys), sum(client.memory_usage(k) or 0 for k in keys)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="redis://127.0.0.1:6379/0")
    ap.add_argument("--per-day", type=int, default=20_000)
    ap.add_argument("--days", type=int, default=30)
    args = ap.parse_args()
    client = connect(args.url)
    ks = KeySpace(f"vqgmem-{uuid.uuid4().hex[:8]}")
    clock = ManualClock(1_786_550_400_000)  # 2026-08-13 00:00 Beijing
    gate = Gate(client, ks, clock)
    step = DAY_MS // args.per_day
    try:
        print(f"| day ({args.per_day:,} requests/day) | lifetime usage | keys | bytes |")
        print("|---|---|---|---|")
        for day in range(1, args.days + 1):
            for n in range(args.per_day):
                if n % 500 == 0:
                    gate.install_snapshot(POOL, Snapshot(10**13, 0, 0, 0, 10**13,
                                                         clock.now_ms() + 7_200_000, 0))
                rid = uuid.uuid4().hex
                gate.reserve(POOL, rid, 5_000)
                gate.settle(POOL, rid, 3_000)
                clock.advance(step)
            count, size = footprint(client, ks.prefix)
            ucum = gate.status(POOL).get("ucum")
            print(f"| {day} | {ucum:,} | {count} | {size:,} |", flush=True)
        keys = ks.pool(POOL)
        print()
        print(f"| key (after {args.days} days) | entries | bytes |")
        print("|---|---|---|")
        for name in ("state", "reservations", "deadlines", "resolved", "resolved_at", "timeline",
                     "timeline_index", "packages", "limit_state"):
            key = getattr(keys, name)
            size = client.memory_usage(key) or 0
            kind = client.type(key).decode()
            counter = {"hash": client.hlen, "zset": client.zcard}.get(kind)
            count = counter(key) if counter else int(bool(size))
            print(f"| {name} | {count:,} | {size:,} |")
    finally:
        for key in client.scan_iter(f"{ks.prefix}:*", count=1000):
            client.delete(key)


if __name__ == "__main__":
    main()
